"""The device side of a run: which device, synchronising it before a clock read, peak memory,
torch dtypes. Shared by the trainer and the measurements (``scalestudy.measure``)."""

from __future__ import annotations

import os
import resource

import torch

from scalestudy.config.vocab import Device, DType
from scalestudy.config.devices import cpu_name, usable_cpus

TORCH_DTYPES = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU, whose ops run synchronously);
    ``scalestudy.train.metrics.synchronize``, the one the step timer uses."""
    from scalestudy.train.metrics import synchronize

    synchronize(device)


def resolve_device_type(requested: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu`` (ROCm builds report cuda)."""
    requested = Device(requested)
    if requested == Device.AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == Device.CUDA and not torch.cuda.is_available():
        raise RuntimeError("platform.device is cuda but no GPU is visible to this process")
    return requested.value


#: Set by the person who starts a run (never by a study): the process-group backend instead of
#: the device's default, e.g. ``gloo`` with CUDA tensors, so that several ranks share one GPU
#: (NCCL refuses two ranks on one device): the GPU check's layouts on a single GPU.
BACKEND_ENV = "SCALESTUDY_DIST_BACKEND"
BACKENDS = ("gloo", "nccl")


def process_group_backend(device_type: str, environ=os.environ) -> str:
    """The backend of this run: ``$SCALESTUDY_DIST_BACKEND`` when set (gloo or nccl), else the
    device's default (``torch.distributed.get_default_backend_for_device``)."""
    import torch.distributed as dist

    asked = environ.get(BACKEND_ENV, "").strip()
    if asked and asked not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}={asked!r}: use one of {', '.join(BACKENDS)}")
    return asked or dist.get_default_backend_for_device(device_type)


def device_index(local_rank: int, count: int) -> int:
    """The GPU of local rank ``local_rank`` on a host with ``count`` of them: its own, or, with
    more ranks than GPUs (ranks sharing a device over gloo), the one it wraps onto."""
    return local_rank % count if count > 0 else local_rank


def local_device(device_type: str) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (made current; ``device_index``) or the CPU."""
    if device_type == "cuda":
        index = device_index(int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count())
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def detect_device(device_type: str) -> dict:
    """``{"device_type", "device_name", "count"}`` of this host for ``cpu`` or ``cuda``.
    For ``cpu`` the count is the usable cores."""
    if device_type == "cpu":
        return {"device_type": "cpu", "device_name": cpu_name(), "count": usable_cpus()}
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device_type='cuda' but torch sees no GPU; use device: cpu")
        return {"device_type": "cuda", "device_name": torch.cuda.get_device_name(0),
                "count": torch.cuda.device_count()}
    raise ValueError(f"device_type={device_type!r} is not supported; allowed: cpu, cuda")


def cpu_rss_bytes() -> int:
    """Current resident set size of this process (bytes)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_memory_bytes(device: torch.device, cpu_baseline: int) -> tuple[int, str]:
    """Peak memory of training on this rank (bytes) and how it was read: CUDA's allocator
    peak, or on CPU the peak RSS above the process's RSS before the model was built (torch
    itself, ~350 MB, excluded), so it compares with the memory model's estimate."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    return max(0, peak - cpu_baseline), "cpu_max_rss_above_baseline"
