"""Predicted vs measured step time of one CPU process (``microbench validate``): the
performance model fed with building blocks measured in this process, against real steps."""

from __future__ import annotations

import statistics
import time

from scalestudy.config.parts import Model
from scalestudy.measure.attention import bench_attention
from scalestudy.measure.bandwidth import bench_bandwidth
from scalestudy.measure.matmul import bench_matmul
from scalestudy.measure.memory import memory_point
from scalestudy.measure.overhead import bench_overhead

VALIDATE_CASES = {
    # name: (model, micro_batch): fp32, one process, plain training loop of scalestudy.model.GPT
    "tiny-b2": (dict(vocab=256, seq_len=64, layers=2, hidden=64, heads=4), 2),
    "tiny-b8": (dict(vocab=256, seq_len=64, layers=2, hidden=64, heads=4), 8),
    "small-h128": (dict(vocab=512, seq_len=128, layers=4, hidden=128, heads=4), 8),
    "small-h256": (dict(vocab=1024, seq_len=128, layers=4, hidden=256, heads=4), 4),
}


def time_training_step(model_cfg: dict, micro_batch: int, steps: int = 10, warmup: int = 3,
                       stat: str = "best") -> float:
    """Seconds of one AdamW step (forward, backward, step) of ``GPT(model_cfg)`` in this
    process (fp32), warm-up steps dropped; ``best`` (fastest) or ``median`` step."""
    import torch

    from scalestudy.models.gpt import GPT

    torch.manual_seed(0)
    cfg = Model(**model_cfg)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(cfg.vocab, (micro_batch, cfg.seq_len + 1))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return min(times) if stat == "best" else statistics.median(times)


def bench_validate(cases: dict | None = None) -> list[dict]:
    """For each case: measure its matmul shapes and the framework overhead, predict the
    step time with ``scalestudy.perf.stepmodel`` from those building blocks, then time the real step; the
    measurements are interleaved so that they share the host's load, and every figure is
    the fastest sample (contention on a shared host only ever adds time)."""
    from scalestudy.perf.hardware import HardwareSpec
    from scalestudy.perf.rates import Measured
    from scalestudy.perf.stepmodel import predict_step_time
    from scalestudy.perf.terms_compute import head_gemm, layer_gemms

    hw = HardwareSpec.load("cpu-local")
    rows = []
    for name, (model, mb) in (cases or VALIDATE_CASES).items():
        point = memory_point(model, mb, "none")
        s, h = model["seq_len"], model["hidden"]
        shapes = {(int(M), int(N), int(K))
                  for M, N, K, _ in layer_gemms(point.model, s, mb)}
        shapes.add(tuple(int(x) for x in head_gemm(point.model, s, mb)[:3]))
        mm = bench_matmul(sorted(shapes), ["fp32"], "cpu", samples=3, min_time_s=0.02)
        att = bench_attention([(mb, model["heads"], s, h // model["heads"])], ["fp32"], "cpu")
        ovh = bench_overhead(samples=5, layouts=("plain",))
        bw = bench_bandwidth(16 * 2**20, "cpu")
        measured = Measured.from_frames(mm, None, ovh, att, bw, stat="best")
        pred = predict_step_time(point, hw, measured)
        t = time_training_step(model, mb)
        rows.append({"case": name, "micro_batch": mb, **model,
                     "predicted_s": pred.step_time_s, "compute_s": pred.compute_s,
                     "gemm_s": pred.gemm_s, "attention_s": pred.attention_s,
                     "elementwise_s": pred.elementwise_s, "overhead_s": pred.overhead_s,
                     "optimizer_s": pred.optimizer_s,
                     "measured_s": t, "rel_error": (pred.step_time_s - t) / t})
    return rows
