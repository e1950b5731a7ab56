"""Device memory bandwidth of a tensor copy."""

from __future__ import annotations

from scalestudy.measure.common import seconds_per_call, torch_device


def bench_bandwidth(nbytes: int = 64 * 2**20, device=None, samples: int = 5) -> list[dict]:
    """Device memory bandwidth of a tensor copy: ``2 · nbytes`` (read + write) per copy."""
    import torch

    device = torch_device(device)
    x = torch.ones(nbytes // 4, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    rows = []
    for i in range(samples):
        sec = seconds_per_call(lambda: y.copy_(x), device, 1)
        rows.append({"device": device.type, "bytes": nbytes, "sample": i, "seconds": sec,
                     "bytes_per_s": 2 * nbytes / sec})
    return rows
