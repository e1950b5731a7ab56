"""Forward + backward of the attention kernel PyTorch picks, by shape and dtype."""

from __future__ import annotations

from scalestudy.measure.common import timed_samples, torch_device, torch_dtype


def bench_attention(shapes: list[tuple[int, int, int, int]], dtypes: list[str], device=None,
                    warmup: int = 2, samples: int = 3, min_time_s: float = 0.02) -> list[dict]:
    """Forward + backward of causal ``scaled_dot_product_attention`` (the kernel PyTorch
    picks) for ``(batch, heads, seq, head_dim)`` shapes. ``flops_per_s`` counts the full
    ``s × s`` products, ``3 · 4·s²·head_dim`` per batch·head (Megatron's convention), so it
    is directly comparable with matmul rates."""
    import torch
    import torch.nn.functional as F

    device = torch_device(device)
    rows = []
    for dt in dtypes:
        if dt == "fp16" and device.type == "cpu":
            continue
        dtype = torch_dtype(dt)
        for b, a, s, hd in shapes:
            q, k, v = (torch.randn(b, a, s, hd, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            g = torch.ones(b, a, s, hd, device=device, dtype=dtype)

            def call():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y.backward(g)

            for i, sec in enumerate(timed_samples(call, device, warmup, samples, min_time_s)):
                rows.append({"device": device.type, "dtype": dt, "batch_heads": b * a, "seq": s,
                             "head_dim": hd, "sample": i, "seconds": sec,
                             "flops_per_s": 3 * 4.0 * s * s * hd * b * a / sec})
    return rows
