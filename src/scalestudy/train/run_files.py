"""What rank 0 writes at the end of a run: ``steps.jsonl``, ``summary.json`` and ``env.json``
(atomically; ``docs/architecture.md`` has their contracts). Valid JSON whatever the loss: a
NaN or infinite loss is written as ``loss`` null with its ``loss_nonfinite`` marker
(``scalestudy.record.steps``), and the reader makes the run ``invalid`` (the loss diverged).
``env.json`` states the ``world_size`` torch.distributed ran with, one entry per rank
(``ranks``) and the ``layout`` (dp, tp, pp, cp) the trainer built its mesh with; the reader
checks them against the point."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scalestudy.config.point import Point
from scalestudy.record.env import common_env
from scalestudy.record import stragglers
from scalestudy.record.profile_record import PROFILE_KEY
from scalestudy.record.io import write_json
from scalestudy.record.run_summary import summary as run_summary
from scalestudy.train import energy
from scalestudy.train.data import SyntheticTokens
from scalestudy.train.device import detect_device
from scalestudy.record.steps import STEPS_FILE, rank_step_time, step_record, write_steps

_SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS",
               "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURMD_NODENAME",
               "SLURM_STEP_NODELIST", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
               "SLURM_CPUS_PER_TASK", "SLURM_JOB_PARTITION")
_DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                "OMP_NUM_THREADS", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


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
        "layout": {"dp": int(point.dp), "tp": point.tp, "pp": point.pp, "cp": point.cp},
        "hosts": sorted({r["host"] for r in ranks}),
        "slurm": {k: v for k, v in ranks[0]["env"].items() if k.startswith("SLURM_")},
        "ranks": ranks,
        "command": os.environ.get("SCALESTUDY_COMMAND") or " ".join(sys.argv),
        "workload": {"kind": str(point.workload.kind)},
        **common_env(point),
    }


def write_record(point: Point, run_dir: Path, gathered: list[dict], device: torch.device,
                 backend: str, t_start: float) -> None:
    """``steps.jsonl`` (per step: the mean loss over the ranks that know it, the ranks' time,
    ``rank_step_time``), ``env.json`` and ``summary.json`` of a finished run (with the ranks'
    spread of step times, ``scalestudy.record.stragglers``)."""
    tr = point.train
    steps, warm = tr.steps, tr.warmup_steps
    step_times = [rank_step_time([g["times"][i] for g in gathered]) for i in range(steps)]
    loss_rows = [g["losses"] for g in gathered if g["losses"] is not None]
    step_loss = [sum(r[i] for r in loss_rows) / len(loss_rows) for i in range(steps)]
    tokens = point.tokens_per_step
    step_energy, energy_summary = energy.summarize([g.get("energy") for g in gathered], steps,
                                                   warm, tokens)

    records = [step_record(i, step_times[i], step_loss[i], tokens, warmup=i < warm)
               | step_energy[i] for i in range(steps)]
    write_steps(run_dir / STEPS_FILE, records)
    mem_bytes, mem_kind = max(g["memory"] for g in gathered)
    summary = run_summary(
        point, records, device_type=device.type,
        device_name=detect_device(device.type)["device_name"], peak_memory_bytes=mem_bytes,
        memory_kind=mem_kind, train_wall_s=time.perf_counter() - t_start,
        loss_noise_floor=SyntheticTokens(point.model.vocab, point.seq_len).noise_floor(),
        energy=energy_summary)
    spread = stragglers.rank_spread(  # hosts by their Slurm node name (srun --exclude's)
        [g["times"] for g in gathered],
        [g["view"]["env"].get("SLURMD_NODENAME") or g["view"]["host"] for g in gathered], warm)
    if spread is not None:
        summary[stragglers.SUMMARY_KEY] = spread
    reserved = [g.get("reserved") for g in gathered if g.get("reserved") is not None]
    if reserved:  # the caching allocator's peak beside the tensors' (the planner's headroom)
        summary["peak_memory_reserved_bytes"] = max(reserved)
    if point.profile.enabled:
        summary[PROFILE_KEY] = {"steps": point.profile.steps, "warmup": point.profile.warmup,
                                "ranks": [g["profile"] for g in gathered]}
    write_json(run_dir / "env.json", env_record(point, device, backend,
                                                [g["view"] for g in gathered]))
    write_json(run_dir / "summary.json", summary)
