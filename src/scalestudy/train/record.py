"""What rank 0 writes at the end of a run: ``steps.jsonl``, ``summary.json`` and ``env.json``
(atomically; ``docs/architecture.md`` has their contracts)."""

from __future__ import annotations

import json
import os
import platform as pyplatform
import socket
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch
import torch.distributed as dist

from scalestudy.config.point import Point
from scalestudy.perf import flops, hardware
from scalestudy.record.io import write_json, write_text
from scalestudy.train import energy
from scalestudy.train.data import SyntheticTokens
from scalestudy.train.device import detect_device

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
               "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME",
               "SLURM_STEP_NODELIST", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
               "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def git_commit() -> str | None:
    """The commit of the scalestudy checkout that runs, when there is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def rank_view(device: torch.device) -> dict:
    """What one rank sees of its placement (for env.json)."""
    env = {k: os.environ[k] for k in _SLURM_VARS + _DEVICE_VARS if k in os.environ}
    return {"rank": dist.get_rank(), "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
            "host": socket.gethostname(), "device": str(device), "env": env}


def env_record(point: Point, device: torch.device, backend: str, ranks: list[dict]) -> dict:
    cuda = device.type == "cuda"
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda, "rocm": getattr(torch.version, "hip", None),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "backend": backend, "device_type": device.type,
        "device_name": detect_device(device.type)["device_name"],
        "device_count": torch.cuda.device_count() if cuda else 0,
        "world_size": dist.get_world_size(),
        "hosts": sorted({r["host"] for r in ranks}),
        "slurm": {k: v for k, v in ranks[0]["env"].items() if k.startswith("SLURM_")},
        "ranks": ranks,
        "git_commit": git_commit(),
        "python": sys.version.split()[0], "platform": pyplatform.platform(),
        "command": os.environ.get("SCALESTUDY_COMMAND") or " ".join(sys.argv),
        "config_hash": point.config_hash,
    }


def write_record(point: Point, run_dir: Path, gathered: list[dict], device: torch.device,
                 backend: str, t_start: float) -> None:
    """``steps.jsonl`` (per step: the mean loss over the ranks that know it, the slowest
    rank's time), ``env.json`` and ``summary.json`` of a finished run."""
    tr = point.train
    steps, warm = tr.steps, tr.warmup_steps
    step_times = [max(g["times"][i] for g in gathered) for i in range(steps)]
    loss_rows = [g["losses"] for g in gathered if g["losses"] is not None]
    step_loss = [sum(r[i] for r in loss_rows) / len(loss_rows) for i in range(steps)]
    tokens = point.tokens_per_step
    step_energy, energy_summary = energy.summarize([g.get("energy") for g in gathered], steps,
                                                   warm, tokens)
    lines = [json.dumps({"step": i, "loss": step_loss[i], "step_time_s": step_times[i],
                         "warmup": i < warm, "tokens": tokens, **step_energy[i]})
             for i in range(steps)]
    write_text(run_dir / "steps.jsonl", "\n".join(lines) + "\n")

    device_name = detect_device(device.type)["device_name"]
    key, peak, source = hardware.resolve_peak(point.platform.hardware or device_name,
                                              tr.precision)
    mem_bytes, mem_kind = max(g["memory"] for g in gathered)
    t_med = median(step_times[warm:])
    table = flops.flops_table(point.model, point.global_batch,
                              point.parallel.activation_checkpointing)
    summary = {
        "point_id": point.point_id, "config_hash": point.config_hash,
        "repeat": point.repeat, "n_params": flops.param_count(point.model),
        "steps": steps, "warmup_steps": warm,
        "loss_first": step_loss[0], "loss_last": step_loss[-1],
        "loss_noise_floor": SyntheticTokens(point.model.vocab, point.seq_len).noise_floor(),
        "tokens_per_step": tokens, "step_time_median_s": t_med, "tokens_per_s": tokens / t_med,
        "model_flops_per_step": table["model"], "hardware_flops_per_step": table["hardware"],
        "device_type": device.type, "device_name": device_name, "hardware": key,
        "dtype": tr.precision, "peak_flops_per_device": peak, "peak_source": source,
        "peak_memory_bytes": mem_bytes, "memory_kind": mem_kind,
        "train_wall_s": time.perf_counter() - t_start,
        "energy": energy_summary,
    }
    write_json(run_dir / "env.json", env_record(point, device, backend,
                                                [g["view"] for g in gathered]))
    write_json(run_dir / "summary.json", summary)
