"""What the microbenchmarks share: the device they run on, timing calls with the device
synchronised around every clock read, the median of samples, and writing a table of rows as
one CSV atomically."""

from __future__ import annotations

import os
import statistics
import time

from scalestudy.config.vocab import DType, allowed


def write_rows(path: str | os.PathLike, rows: list[dict]) -> None:
    import pandas as pd

    from scalestudy.record.io import atomic_path

    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


def torch_device(name: str | None):
    import torch

    from scalestudy.train.device import resolve_device_type

    return torch.device(resolve_device_type(name or "auto"))


def sync_device(device) -> None:
    from scalestudy.train.device import sync

    sync(device)


def device_name(device) -> str:
    from scalestudy.train.device import detect_device

    return detect_device(device.type)["device_name"]


def torch_dtype(name: str):
    from scalestudy.train.device import TORCH_DTYPES

    try:
        return TORCH_DTYPES[DType(name)]
    except ValueError:
        raise ValueError(f"--dtypes {name!r} is not supported; use one of "
                         f"{allowed(DType)}") from None


def timed_samples(call, device, warmup: int, samples: int, min_time_s: float) -> list[float]:
    """Seconds per ``call()``: ``samples`` measurements, each repeating the call until
    ``min_time_s`` has passed, after ``warmup`` untimed calls; the device is synchronised
    before every clock read."""
    for _ in range(warmup):
        call()
    sync_device(device)
    t0 = time.perf_counter()
    call()
    sync_device(device)
    reps = max(1, int(min_time_s / max(time.perf_counter() - t0, 1e-7)))
    return [seconds_per_call(call, device, reps) for _ in range(samples)]


def seconds_per_call(call, device, reps: int) -> float:
    """Seconds per ``call()`` over ``reps`` back-to-back calls, the device synchronised before
    both clock reads."""
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    sync_device(device)
    return (time.perf_counter() - t0) / reps


def summarize(rows: list[dict], key: list[str], value: str = "seconds") -> list[dict]:
    """Median of ``value`` over samples, grouped by ``key`` columns."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in key), []).append(r[value])
    return [{**dict(zip(key, k)), value: statistics.median(v)} for k, v in groups.items()]
