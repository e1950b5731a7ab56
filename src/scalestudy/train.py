"""Train one sweep point under torchrun and write its run record.

    torchrun ... -m scalestudy.train RUN_DIR/point.json RUN_DIR

The only module that talks to devices. Every rank trains; rank 0 writes ``steps.jsonl``,
``summary.json`` and ``env.json`` (atomically). Timing: the device is synchronised before each
clock read; a step is the optimizer step over the whole global batch (all micro-batches);
its time is the maximum over ranks; the first ``warmup_steps`` are marked and excluded from the
summary. The runner (``scalestudy.runner``) writes ``status.json`` after this process ends.
"""

from __future__ import annotations

import json
import os
import platform as pyplatform
import resource
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist

from scalestudy import flops, hardware, runner
from scalestudy.data import SyntheticTokens
from scalestudy.io import read_json, write_json, write_text
from scalestudy.model import GPTConfig
from scalestudy.parallel import Engine, Layout, build_mesh

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
               "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME",
               "SLURM_STEP_NODELIST", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
               "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cpu_rss_bytes() -> int:
    """Current resident set size of this process (bytes)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_memory_bytes(device: torch.device, cpu_baseline: int) -> tuple[int, str]:
    """Peak memory of training on this rank: CUDA's allocator peak, or on CPU the peak RSS
    above the process's RSS before the model was built (torch itself, ~350 MB, excluded), so
    it compares with the memory model's estimate."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return max(0, peak - cpu_baseline), "cpu_max_rss_above_baseline"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _rank_view(device: torch.device) -> dict:
    """What one rank sees of its placement (for env.json)."""
    env = {k: os.environ[k] for k in _SLURM_VARS + _DEVICE_VARS if k in os.environ}
    return {"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "host": socket.gethostname(), "device": str(device), "env": env}


def _env_record(point: dict, device: torch.device, backend: str, ranks: list[dict]) -> dict:
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda, "rocm": getattr(torch.version, "hip", None),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "backend": backend, "device_type": device.type,
        "device_name": hardware.detect_device(device.type)["device_name"],
        "device_count": torch.cuda.device_count() if cuda else 0,
        "world_size": dist.get_world_size(),
        "hosts": sorted({r["host"] for r in ranks}),
        "slurm": {k: v for k, v in ranks[0]["env"].items() if k.startswith("SLURM_")},
        "ranks": ranks,
        "git_commit": _git_commit(),
        "python": sys.version.split()[0], "platform": pyplatform.platform(),
        "command": os.environ.get("SCALESTUDY_COMMAND") or " ".join(sys.argv),
        "config_hash": point["config_hash"],
    }


def timed_steps(engine: Engine, batches: list[torch.Tensor], device: torch.device,
                before_step=None) -> tuple[list, list[float]]:
    """The timed loop: one ``engine.train_step`` per batch, the device synchronised before
    each clock read. Returns (losses as returned by the engine, step times in seconds); no
    host sync or collective beyond that inside the loop. ``before_step(i)`` runs untimed."""
    losses, times = [], []
    for i, batch in enumerate(batches):
        if before_step is not None:
            before_step(i)
        _sync(device)
        t0 = time.perf_counter()
        loss = engine.train_step(batch)
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)
    return losses, times


def run(point: dict, run_dir: Path) -> None:
    t_start = time.perf_counter()
    plat, tr = point["platform"], point["train"]
    device_type = hardware.resolve_device_type(plat["device"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = dist.get_default_backend_for_device(device_type)
    dist.init_process_group(backend, timeout=timedelta(seconds=plat["collective_timeout_s"]),
                            device_id=device if device_type == "cuda" else None)
    rank = dist.get_rank()

    cpu_baseline = _cpu_rss_bytes() if device_type == "cpu" else 0
    layout = Layout.from_point(point)
    cfg = GPTConfig.from_dict(point["model"])
    mesh = build_mesh(layout, device_type)
    engine = Engine(cfg, layout, mesh, device, seed=tr["seed"], lr=tr["lr"],
                    weight_decay=tr["weight_decay"], grad_clip=tr["grad_clip"])

    data = SyntheticTokens(cfg.vocab, cfg.seq_len, seed=tr["seed"])
    rows = point["micro_batch"] * point["grad_accum"]
    batches = [data.rows(s, engine.dp_rank * rows, rows).to(device) for s in range(tr["steps"])]

    fault = runner.fault_for(point, rank)  # test hook: None unless SCALESTUDY_FAULT is set
    losses, times = timed_steps(engine, batches, device,
                                before_step=(lambda s: runner.inject_fault(fault, s)) if fault else None)

    # One gather at the end: no host sync or collective inside the timed loop.
    have_loss = losses[0] is not None
    local = {"times": times, "losses": [float(x) for x in losses] if have_loss else None,
             "memory": _peak_memory_bytes(device, cpu_baseline), "view": _rank_view(device)}
    gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, local)

    if rank == 0:
        _write_record(point, run_dir, gathered, cfg, device, backend, t_start)
    dist.barrier()
    engine.close()
    del engine
    dist.destroy_process_group()


def _write_record(point, run_dir, gathered, cfg, device, backend, t_start) -> None:
    tr = point["train"]
    steps, warm = tr["steps"], tr["warmup_steps"]
    step_times = [max(g["times"][i] for g in gathered) for i in range(steps)]
    loss_rows = [g["losses"] for g in gathered if g["losses"] is not None]
    step_loss = [sum(r[i] for r in loss_rows) / len(loss_rows) for i in range(steps)]
    tokens = point["tokens_per_step"]
    lines = [json.dumps({"step": i, "loss": step_loss[i], "step_time_s": step_times[i],
                         "warmup": i < warm, "tokens": tokens}) for i in range(steps)]
    write_text(run_dir / "steps.jsonl", "\n".join(lines) + "\n")

    dtype = point["train"]["precision"]
    device_name = hardware.detect_device(device.type)["device_name"]
    key, peak, source = hardware.resolve_peak(point["platform"]["hardware"] or device_name, dtype)
    mem_bytes, mem_kind = max(g["memory"] for g in gathered)
    steady = step_times[warm:]
    t_med = median(steady)
    rows = point["global_batch"]
    ac = point["parallel"]["activation_checkpointing"]
    summary = {
        "point_id": point["point_id"], "config_hash": point["config_hash"],
        "repeat": point["repeat"], "n_params": flops.gpt_params(cfg),
        "steps": steps, "warmup_steps": warm,
        "loss_first": step_loss[0], "loss_last": step_loss[-1],
        "loss_noise_floor": SyntheticTokens(cfg.vocab, cfg.seq_len).noise_floor(),
        "tokens_per_step": tokens, "step_time_median_s": t_med, "tokens_per_s": tokens / t_med,
        "model_flops_per_step": {c: flops.model_flops_per_step(cfg, rows, c)
                                 for c in flops.CONVENTIONS},
        "hardware_flops_per_step": {c: flops.hardware_flops_per_step(cfg, rows, c, ac)
                                    for c in flops.CONVENTIONS},
        "device_type": device.type, "device_name": device_name, "hardware": key,
        "dtype": dtype, "peak_flops_per_device": peak, "peak_source": source,
        "peak_memory_bytes": mem_bytes, "memory_kind": mem_kind,
        "train_wall_s": time.perf_counter() - t_start,
    }
    write_json(run_dir / "env.json", _env_record(point, device, backend,
                                                 [g["view"] for g in gathered]))
    write_json(run_dir / "summary.json", summary)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m scalestudy.train POINT_JSON RUN_DIR", file=sys.stderr)
        return 2
    point = read_json(argv[0])
    run(point, Path(argv[1]))
    return 0


def exit_now(code: int) -> None:
    """End a finished rank without the interpreter's teardown of torch's modules and
    threads (~1.1 s per process on the 2-core dev host, measured around torchrun; more than
    the rest of the start-up beyond ``import torch``). Only after ``run`` returned: every
    record is written, closed and renamed, and the process group is destroyed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
