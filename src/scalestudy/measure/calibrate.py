"""Measured matmul ceiling of one device: the denominator of "utilisation vs measured ceiling",
which gives a CPU run (no spec peak) a meaningful percentage.

    python -m scalestudy calibrate --device cpu|cuda --dtype fp32|bf16 --out FILE [--size N]

Times square ``N×N @ N×N`` matmuls (2·N³ FLOPs each): the device is synchronised before every
clock read, warm-up matmuls are excluded, each sample runs enough matmuls to last ≳ 20 ms,
and the result is the median of the samples. On CPU one "device" is one training process,
which runs with its share of the host's cores (``run.launch.threads_per_process``: one
thread on a 2-core host of 8 devices), and so does the calibration.
Bounded by ``--max-seconds`` (default 5 s) after warm-up.

On a CPU, ``--overhead`` adds the framework overhead of a degenerate model and the copy
bandwidth. The study's own model timed piece by piece, the cost of sharing the cores and the
wait at a synchronisation are measured in slices across the sweep
(``scalestudy.measure.host_slices``) and pooled into this record. The performance model
composes a CPU study's steps from these (``scalestudy.perf.stepmodel``).

``--shapes MxNxK ...`` also times ``[M×K] @ [K×N]`` at each given shape (the study's own
products, ``scalestudy.perf.terms_compute.gemm_shapes``), the same way with samples of ≳ 10 ms: small products
reach a fraction of the ceiling, and the performance model needs their rate.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
import statistics
import time

import torch

from scalestudy.config.vocab import DType
from scalestudy.measure.common import timed_samples
from scalestudy.run.launch import threads_per_process
from scalestudy.train.device import TORCH_DTYPES, detect_device, sync

_DEFAULT_SIZE = {"cpu": 512, "cuda": 8192}


def measure(
    device_type: str = "cpu",
    dtype: str = "fp32",
    size: int | None = None,
    samples: int = 15,
    warmup: int = 3,
    max_seconds: float = 5.0,
    threads: int | None = 1,
) -> dict:
    """Measure the matmul ceiling; returns the ``calibration.json`` record (FLOP/s)."""
    torch_dtype = TORCH_DTYPES[DType(dtype)]
    info = detect_device(device_type)
    device = torch.device(device_type)
    if device_type == "cpu" and threads:
        torch.set_num_threads(threads)
    n = int(size or _DEFAULT_SIZE[device_type])
    while True:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(n, n, generator=g).to(device=device, dtype=torch_dtype)
        b = torch.randn(n, n, generator=g).to(device=device, dtype=torch_dtype)
        torch.mm(a, b)
        sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        per = max(time.perf_counter() - t0, 1e-7)
        # A pathologically slow path (bf16 on a CPU without bf16 units) would blow the time
        # budget: halve the size unless it was given explicitly.
        if size or per * samples <= max_seconds or n <= 128:
            break
        n //= 2
    out = torch.empty_like(a)
    secs = timed_samples(lambda: torch.mm(a, b, out=out), device, warmup, samples, 0.02)
    rates = [2.0 * n**3 / t for t in secs]

    return {
        "device_name": info["device_name"],
        "device_type": device_type,
        "host": socket.gethostname(),
        "dtype": dtype,
        "m": n, "n": n, "k": n,
        "flops_per_s": statistics.median(rates),
        "samples_flops_per_s": rates,
        "warmup": warmup,
        "threads": torch.get_num_threads() if device_type == "cpu" else None,
        "torch": torch.__version__,
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "method": "median of samples of back-to-back square matmuls, device synchronised "
                  "before each clock read, warm-up excluded",
    }


def measure_shapes(device_type: str, dtype: str, shapes: list[tuple[int, int, int]],
                   samples: int = 5, min_time_s: float = 0.01) -> list[dict]:
    """FLOP/s (median of ``samples``) of ``[M×K] @ [K×N]`` per ``(M, N, K)``; the device is
    synchronised before each clock read and one warm-up product per shape is excluded."""
    device = torch.device(device_type)
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for m, n, k in shapes:
        torch_dtype = TORCH_DTYPES[DType(dtype)]
        a = torch.randn(m, k, generator=g).to(device=device, dtype=torch_dtype)
        b = torch.randn(k, n, generator=g).to(device=device, dtype=torch_dtype)
        c = torch.empty(m, n, device=device, dtype=torch_dtype)
        secs = timed_samples(lambda: torch.mm(a, b, out=c), device, 1, samples, min_time_s)
        out.append({"m": m, "n": n, "k": k, "flops_per_s": 2.0 * m * n * k / statistics.median(secs)})
    return out


def process_threads(devices_per_node: int, environ=os.environ) -> int:
    """CPU threads of one training process of the study, as its points get them:
    ``OMP_NUM_THREADS`` when set, else one device's share of the host
    (``run.launch.threads_per_process``)."""
    omp = environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        return int(omp)
    return threads_per_process(1, devices_per_node, environ)
