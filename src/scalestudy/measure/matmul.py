"""Matmul throughput by shape and dtype (``microbench matmul``): rows ``device,
device_name, dtype, m, n, k, sample, seconds, flops_per_s``, one per timed sample."""

from __future__ import annotations

import time

from scalestudy.config.vocab import DType
from scalestudy.measure.common import device_name, timed_samples, torch_device, torch_dtype


def bench_matmul(
    shapes: list[tuple[int, int, int]], dtypes: list[str], device=None, warmup: int = 2,
    samples: int = 5, min_time_s: float = 0.05, budget_s: float = 25.0,
) -> list[dict]:
    """Time ``A[m,k] @ B[k,n]`` for every shape and dtype; one row per sample. Each sample
    repeats the call until ``min_time_s`` has passed; stops early after ``budget_s``."""
    import torch

    device = torch_device(device)
    t_start = time.perf_counter()
    rows = []
    for dt in dtypes:
        dtype = torch_dtype(dt)
        if dt == DType.FP16 and device.type == "cpu":
            continue  # pathologically slow on CPU (minutes per product); skipped, not guessed
        for m, n, k in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            secs = timed_samples(lambda: torch.mm(a, b), device, warmup, samples, min_time_s)
            for i, dt_s in enumerate(secs):
                rows.append({
                    "device": device.type, "device_name": device_name(device), "dtype": dt,
                    "m": m, "n": n, "k": k, "sample": i, "seconds": dt_s,
                    "flops_per_s": 2.0 * m * n * k / dt_s,
                })
            if time.perf_counter() - t_start > budget_s:
                return rows
    return rows
