"""Trainer efficiency on one accelerator: tokens/s, MFU, peak memory of a ~1B-parameter GPT.

Every configuration is a real sweep point run the way the pipeline runs one: ``point.json``
-> ``scalestudy.run.runner`` (watchdog, outcome classification) -> torchrun -> ``scalestudy.train``
(``Engine``: bf16 autocast with fp32 master weights, fused AdamW on CUDA, SDPA attention --
flash on CUDA -- optional ``torch.compile`` per block, activation checkpointing none / full).
MFU = model FLOPs per step (``megatron`` convention, no recompute) / (median steady step time
x peak); HFU counts the recompute. Denominators: the spec peak from the peaks table (H200-SXM:
989 TFLOP/s dense bf16; none for a CPU) and the measured matmul ceiling of the same device
(``scalestudy.measure.calibrate``, run in its own process first).

``smoke=True`` runs the same code path with a tiny model on the CPU (what the tests use).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import figure
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.identity import identify
from scalestudy.config import flops

TARGET_MFU = 0.50
# ~1.1B parameters: 18 layers x 12 h^2 (906M) + untied embedding and head (2 x 103M).
MODEL_1B = Model(name="gpt-1b", vocab=50304, seq_len=2048, layers=18, hidden=2048, heads=16,
                 ffn_hidden=None, mlp="gelu", tied_embeddings=False, bias=False)
MODEL_SMOKE = Model(name="gpt-smoke", vocab=256, seq_len=64, layers=2, hidden=64, heads=4,
                    ffn_hidden=None, mlp="gelu", tied_embeddings=False, bias=False)
# (name, activation checkpointing, torch.compile)
CONFIGS = (("eager", "none", False), ("eager-ac", "full", False), ("compile", "none", True),
           ("compile-ac", "full", True))

RECORD_FIELDS = (
    "config", "state", "reason", "device_type", "device_name", "hardware", "n_params",
    "seq_len", "micro_batch", "tokens_per_step", "precision", "activation_checkpointing",
    "compile", "steps", "warmup_steps", "step_time_median_s", "tokens_per_s",
    "model_tflops_per_s", "hardware_tflops_per_s", "peak_tflops", "mfu", "hfu",
    "measured_ceiling_tflops", "util_vs_measured_ceiling", "peak_memory_gb", "memory_kind",
    "loss_first", "loss_last", "train_wall_s", "status_wall_s",
)


def make_point(name: str, model: Model, *, micro_batch: int, ac: str, compile: bool,
               steps: int, warmup: int, device: str, precision: str = "bf16",
               timeout_s: float = 600) -> Point:
    """The single-device point of configuration ``name`` (identified: config hash and id)."""
    point = Point.for_layout(
        dataclasses.replace(model, name=name), micro_batch=micro_batch,
        activation_checkpointing=ac, compile=bool(compile), steps=steps, warmup_steps=warmup,
        lr=3e-4, weight_decay=0.1, grad_clip=1.0, seed=0, precision=precision, device=device,
        hardware=None, devices_per_node=1, timeout_s=timeout_s, collective_timeout_s=300,
        study="bench-gpu", series=name, mode="weak", baseline_n=1, flops_convention="megatron")
    return identify(point)


def run_dir_name(config: str) -> str:
    """The run folder of configuration ``config`` under ``<out>/runs/`` (stable across
    versions, unlike the point id, which carries the config hash)."""
    return f"gpu-{config}"


def calibrate(device: str, out: Path, smoke: bool, timeout: float = 180) -> dict | None:
    """The measured bf16 matmul ceiling, in its own process (so it holds no device memory
    while training runs). None if it fails."""
    argv = [sys.executable, "-m", "scalestudy", "calibrate", "--device", device, "--dtype", "bf16",
            "--out", str(out)]
    argv += ["--size", "256", "--samples", "5", "--max-seconds", "1"] if smoke else []
    if device == "cpu":
        argv += ["--threads", "1"]
    try:
        subprocess.run(argv, check=True, timeout=timeout, capture_output=True, text=True)
        return json.loads(out.read_text())
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def record(config: str, point: Point, run_dir: Path, calibration: dict | None) -> dict:
    """One tidy row from a finished run directory (every field of RECORD_FIELDS present)."""
    def load(name):
        try:
            return json.loads((run_dir / name).read_text())
        except (OSError, ValueError):
            return {}

    status, s = load("status.json"), load("summary.json")
    rec = dict.fromkeys(RECORD_FIELDS)
    par, tr = point.parallel, point.train
    rec.update(config=config, state=status.get("state", "not_run"), reason=status.get("reason", ""),
               seq_len=point.seq_len, micro_batch=point.micro_batch,
               tokens_per_step=point.tokens_per_step, precision=str(tr.precision),
               activation_checkpointing=str(par.activation_checkpointing), compile=tr.compile,
               steps=tr.steps, warmup_steps=tr.warmup_steps,
               status_wall_s=status.get("wall_s"))
    for k in ("device_type", "device_name", "hardware", "n_params", "step_time_median_s",
              "tokens_per_s", "memory_kind", "loss_first", "loss_last", "train_wall_s"):
        rec[k] = s.get(k)
    t = s.get("step_time_median_s")
    if rec["state"] == "ok" and t:
        conv = str(point.flops_convention)
        mf, hf = s["model_flops_per_step"][conv], s["hardware_flops_per_step"][conv]
        peak = s.get("peak_flops_per_device")
        rec.update(model_tflops_per_s=mf / t / 1e12, hardware_tflops_per_s=hf / t / 1e12,
                   peak_tflops=peak / 1e12 if peak else None,
                   mfu=flops.utilisation(mf, t, 1, peak) if peak else None,
                   hfu=flops.utilisation(hf, t, 1, peak) if peak else None,
                   peak_memory_gb=s["peak_memory_bytes"] / 1e9)
        if calibration and calibration.get("flops_per_s"):
            rec["measured_ceiling_tflops"] = calibration["flops_per_s"] / 1e12
            rec["util_vs_measured_ceiling"] = flops.utilisation(mf, t, 1,
                                                                calibration["flops_per_s"])
    return rec


def measure(out_dir: str | Path, *, smoke: bool = False, configs: list[str] | None = None,
            micro_batch: int | None = None, steps: int | None = None,
            timeout_s: float | None = None, launcher: str = "runner",
            budget_s: float | None = None, on_point=None) -> dict:
    """Run the configurations (names from CONFIGS, in the order given; default: eager,
    compile, eager-ac on a GPU; eager, eager-ac in a smoke run) and return ``{"records": [...], "calibration", "figures"}``.
    ``launcher``: ``runner`` (the pipeline's runner + torchrun) or ``inprocess`` (train.run in
    this process; smoke tests only). ``budget_s`` bounds the whole call: each point's watchdog
    gets at most what is left, and a point with under 30 s left is skipped (state
    ``skipped``). Records are also written after every point to ``out_dir/gpu_records.json``,
    so a run killed from outside keeps what it measured, and handed to ``on_point``
    (``{"records", "calibration"}``) when given."""
    from scalestudy.record.io import write_json, write_text
    from scalestudy.run import runner

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if smoke else "cuda"
    model = MODEL_SMOKE if smoke else MODEL_1B
    mb = micro_batch or (2 if smoke else 8)
    steps = steps or (4 if smoke else 20)
    warmup = 1 if smoke else 5
    timeout_s = timeout_s or (120 if smoke else 240)
    wanted = configs or (["eager", "eager-ac"] if smoke else ["eager", "compile", "eager-ac"])
    unknown = set(wanted) - {c[0] for c in CONFIGS}
    if unknown:
        raise ValueError(f"configs {sorted(unknown)}: use names from {[c[0] for c in CONFIGS]}")

    t0 = time.monotonic()
    calibration = calibrate(device, out_dir / "calibration.json", smoke)
    records = []
    by_name = {c[0]: c for c in CONFIGS}
    for name, ac, comp in (by_name[w] for w in wanted):
        left = None if budget_s is None else budget_s - (time.monotonic() - t0)
        # the watchdog gets at most what is left of the budget (timeouts are not hashed)
        point = make_point(name, model, micro_batch=mb, ac=ac, compile=comp, steps=steps,
                           warmup=warmup, device=device,
                           timeout_s=timeout_s if left is None else max(1.0, min(timeout_s, left - 10)))
        run_dir = out_dir / "runs" / run_dir_name(name)
        run_dir.mkdir(parents=True, exist_ok=True)
        if left is not None and left < 30:
            records.append(dict(record(name, point, run_dir, None), state="skipped",
                                reason=f"time budget of {budget_s:g} s used up"))
            continue
        write_text(run_dir / "point.json", point.json_text())
        print(f"bench gpu: {name} (ac={ac}, compile={comp}, micro_batch={mb}) ...",
              file=sys.stderr, flush=True)
        if launcher == "runner":
            runner.run_point(run_dir / "point.json", run_dir)
        else:
            _run_inprocess(point, run_dir)
        records.append(record(name, point, run_dir, calibration))
        r = records[-1]
        print(f"bench gpu: {name}: {r['state']} {r['reason']} tokens/s={r['tokens_per_s']} "
              f"mfu={r['mfu']} peak_memory_gb={r['peak_memory_gb']}", file=sys.stderr, flush=True)
        write_json(out_dir / "gpu_records.json", {"calibration": calibration, "records": records})
        if on_point is not None:
            on_point({"calibration": calibration, "records": records})
    elapsed = time.monotonic() - t0

    figs = []
    for r in records:
        c = r["config"]
        if r["state"] != "ok":
            figs.append(figure("gpu", f"{c}: run", None, "", note=f"{r['state']}: {r['reason']}"))
            continue
        figs.append(figure("gpu", f"{c}: MFU vs spec peak", r["mfu"], "fraction",
                           TARGET_MFU, ">=",
                           f"{r['device_name']} peak {r['peak_tflops']} TFLOP/s" if r["mfu"]
                           is not None else f"no spec peak for {r['device_name']}"))
        figs.append(figure("gpu", f"{c}: utilisation vs measured matmul ceiling",
                           r["util_vs_measured_ceiling"], "fraction",
                           note=f"ceiling {r['measured_ceiling_tflops'] or float('nan'):.4g} TFLOP/s"
                                " (bf16 matmul, measured)"))
        figs.append(figure("gpu", f"{c}: tokens/s", r["tokens_per_s"], "tokens/s",
                           note=f"{r['n_params'] / 1e9:.3g}B params, seq {r['seq_len']}, "
                                f"micro-batch {r['micro_batch']}, HFU {_pct(r['hfu'])}"))
        figs.append(figure("gpu", f"{c}: peak memory", r["peak_memory_gb"], "GB",
                           note=r["memory_kind"] or ""))
    return {"smoke": smoke, "device": device, "launcher": launcher, "elapsed_s": elapsed,
            "calibration": calibration, "records": records, "figures": figs}


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _run_inprocess(point: Point, run_dir: Path) -> None:
    """``train.run`` in this process as a one-rank job (env:// rendezvous on a free port),
    then the runner's ``status.json`` (ok or crashed with the exception)."""
    from datetime import datetime, timezone

    from scalestudy.record.io import write_json
    from scalestudy.run.nodes import free_port
    from scalestudy.train import loop as train

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    started, t0 = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    try:
        train.run(point, run_dir)
        state, reason, code = "ok", "", 0
    except Exception as e:  # noqa: BLE001 - recorded as data, like the runner does
        state, reason, code = "crashed", f"{type(e).__name__}: {e}"[:300], 1
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    write_json(run_dir / "status.json", {
        "state": state, "reason": reason, "evidence": [], "exit_code": code, "started": started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t0, 3)})
