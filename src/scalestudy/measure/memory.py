"""Memory estimate vs measured peak on CPU (``microbench memory [--trainer]``): tiny fp32
GPT training steps in fresh subprocesses, and the trainer itself under torchrun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.identity import identify

MEMORY_CASES = {
    # name: (model, micro_batch, activation_checkpointing) — fp32, one process
    "state": (dict(vocab=4096, seq_len=64, layers=4, hidden=256, heads=4), 2, "none"),
    "activations": (dict(vocab=512, seq_len=256, layers=4, hidden=128, heads=4), 16, "none"),
    "activations_full_ckpt": (dict(vocab=512, seq_len=256, layers=4, hidden=128, heads=4), 16, "full"),
}


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(spec: dict) -> dict:
    """Runs in a fresh process: peak resident bytes above the baseline over ``steps`` AdamW
    steps of a GPT (fp32)."""
    import gc

    import torch
    from torch.utils.checkpoint import checkpoint

    from scalestudy.models.gpt import GPT

    torch.manual_seed(0)
    cfg = Model(**spec["model"])
    b, s = spec["micro_batch"], cfg.seq_len
    tokens = torch.randint(cfg.vocab, (b, s + 1))

    def step(model, opt, ckpt):
        x, y = tokens[:, :-1], tokens[:, 1:]
        pos = torch.arange(s)
        h = model.tok_embeddings(x) + model.pos_embeddings(pos)
        for layer in model.layers.values():
            h = checkpoint(layer, h, use_reentrant=False) if ckpt == "full" else layer(h)
        logits = model.output(model.norm(h))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # warm up kernels and libraries on a tiny model so their one-off buffers are in the baseline
    small = GPT(Model(vocab=cfg.vocab, seq_len=s, layers=1, hidden=32, heads=2))
    o = torch.optim.AdamW(small.parameters())
    saved = tokens
    tokens = tokens[:1]
    step(small, o, spec["ckpt"])
    tokens = saved
    del small, o
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _vm("VmRSS")
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    for _ in range(spec.get("steps", 3)):
        step(model, opt, spec["ckpt"])
    peak = _vm("VmHWM")
    return {"measured_bytes": peak - base, "baseline_bytes": base}


def memory_point(model: dict, micro_batch: int, ckpt: str, **options) -> Point:
    """The point of a one-process fp32 run of ``model`` (a dict of :class:`Model` fields);
    ``options`` as in :meth:`Point.for_layout`."""
    return Point.for_layout(Model(**model), micro_batch=micro_batch,
                            activation_checkpointing=ckpt, **options)


def bench_memory(cases: dict | None = None, timeout_s: float = 120) -> list[dict]:
    """Measured peak vs ``memory.estimate`` for each case (fresh subprocess each)."""
    from scalestudy.perf import memory

    rows = []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
           "OMP_NUM_THREADS": "1"}
    for name, (model, mb, ckpt) in (cases or MEMORY_CASES).items():
        spec = {"model": model, "micro_batch": mb, "ckpt": ckpt, "steps": 3}
        out = subprocess.run(
            [sys.executable, "-m", "scalestudy", "microbench", "_memory_child", json.dumps(spec)],
            env=env, capture_output=True, text=True, timeout=timeout_s, check=True,
        )
        meas = json.loads(out.stdout.strip().splitlines()[-1])
        est = memory.estimate(memory_point(model, mb, ckpt))
        row = {"case": name, "activation_checkpointing": ckpt, "micro_batch": mb, **model}
        row.update({f"est_{k}": est[k] for k in memory.COMPONENTS})
        row["est_total_bytes"] = est["total_bytes"]
        row["measured_bytes"] = meas["measured_bytes"]
        row["baseline_bytes"] = meas["baseline_bytes"]
        row["rel_error"] = (est["total_bytes"] - meas["measured_bytes"]) / meas["measured_bytes"]
        rows.append(row)
    return rows


def bench_memory_trainer(dp_modes=("ddp", "zero1", "fsdp"), nproc: int = 2,
                         timeout_s: float = 300) -> list[dict]:
    """The trainer's own peak (``summary.json`` ``peak_memory_bytes``, max RSS over ranks)
    under each ``dp_mode`` at dp = ``nproc``, minus that of a degenerate model run the same
    way (torch, gloo and the data: the baseline), against ``memory.estimate``. glibc is told
    to ``mmap`` allocations over 64 KiB so freed tensors leave the resident set."""
    import tempfile

    from scalestudy.perf import memory

    big = dict(vocab=8192, seq_len=64, layers=4, hidden=256, heads=4, name="mem")
    degenerate = dict(big, vocab=16, layers=1, hidden=8, heads=2, name="baseline")
    from scalestudy.run.launch import LOOPBACK_ENV, local_torchrun

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
           "OMP_NUM_THREADS": "1", **{var: "lo" for var in LOOPBACK_ENV}}
    peaks, points = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, mode in [("baseline", degenerate, "ddp")] + [(m, big, m) for m in dp_modes]:
            p = identify(memory_point(model, 2, "none", dp=nproc, dp_mode=mode, steps=3,
                                      warmup_steps=1, lr=1e-3, device="cpu",
                                      timeout_s=timeout_s, study="memcheck",
                                      series=f"mem-{name}"))
            d = Path(tmp) / name
            d.mkdir()
            (d / "point.json").write_text(p.json_text())
            subprocess.run(["timeout", str(int(timeout_s)), *local_torchrun(nproc),
                            "-m", "scalestudy.train", str(d / "point.json"), str(d)],
                           env=env, capture_output=True, text=True, check=True)
            peaks[name] = json.loads((d / "summary.json").read_text())["peak_memory_bytes"]
            points[name] = p
    rows = []
    for mode in dp_modes:
        est = memory.estimate(points[mode])
        meas = peaks[mode] - peaks["baseline"]
        row = {"case": f"trainer-{mode}", "dp": nproc, **{f"est_{k}": est[k] for k in memory.COMPONENTS}}
        row.update(est_total_bytes=est["total_bytes"], measured_bytes=meas,
                   baseline_bytes=peaks["baseline"], rel_error=(est["total_bytes"] - meas) / meas)
        rows.append(row)
    return rows
