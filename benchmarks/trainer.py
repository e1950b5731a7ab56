"""Trainer overhead: ``Engine`` + ``train.timed_steps`` vs a bare PyTorch loop, one process.

Both loops train the same GPT (same seed, config, batch, AdamW settings and gradient clipping)
on the same pre-built batches, on the same device, in one process. They run in alternating
blocks (trainer-bare, bare-trainer, ...) so a drift in machine load hits both alike; each block
is timed from outside (one clock around ``block`` steps, device synchronised), after warm-up
blocks of each. The figure is the median over rounds of the per-round ratio
``trainer block time / bare block time`` minus 1 (the trainer's overhead, target <= 5%),
by the wall clock and by the process's CPU time: on a shared host (other tenants' load) the
wall clock of a one-thread CPU run mostly measures the scheduler, the CPU time the work.

The bare loop is what one would write by hand: forward, fp32 cross-entropy, backward,
``clip_grad_norm_``, ``optimizer.step()``, ``zero_grad(set_to_none=True)`` -- no timers, no
mesh, no wrapper. At world size 1 the engine adds no DDP wrapper (dp == 1) and no collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from pathlib import Path

from benchmarks import figure
from scalestudy.config.point import Point
from scalestudy.config.identity import identify

TARGET_OVERHEAD = 0.05


def default_point(study_file: str | Path | None = None, series_mode: str = "weak") -> Point:
    """The default study's single-process point (N=1) of its first ``series_mode`` series."""
    from scalestudy import paths
    from scalestudy.config.study import load_study
    from scalestudy.plan.planner import plan_points

    if study_file is None:
        study_file = paths.workflow_dir() / "config" / "default.yaml"
    points = plan_points(load_study(study_file))
    for p in points:
        if p.n == 1 and p.mode == series_mode and p.feasible:
            return p
    raise ValueError(f"{study_file}: no feasible N=1 point in a {series_mode} series")


def scaled_point(point: Point, **model) -> Point:
    """``point`` with model fields replaced (e.g. a bigger model), identified anew."""
    return identify(point.replace(model=dataclasses.replace(point.model, **model)), point.repeat)


def _one_process(point: Point) -> Point:
    """The comparison runs in one process: ``point`` must be a single-device layout."""
    if (point.n, point.dp, point.tp, point.pp) != (1, 1, 1, 1):
        raise ValueError(f"point {point.point_id}: the trainer benchmark needs N=1 "
                         f"(dp=tp=pp=1), got N={point.n} dp={point.dp} tp={point.tp} pp={point.pp}")
    return point


@contextlib.contextmanager
def single_process_group():
    """A world-size-1 gloo process group in this process (what torchrun gives a 1-rank job),
    unless one exists already."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class BareLoop:
    """The hand-written reference: same model, optimizer and clipping as the engine."""

    def __init__(self, cfg, device, *, seed: int, lr: float, weight_decay: float,
                 grad_clip: float | None, grad_accum: int, betas: tuple[float, float]):
        import torch

        from scalestudy.models import build_model

        torch.manual_seed(seed)
        self.model = build_model(cfg).to(device)
        self.params = list(self.model.parameters())
        kw = {"fused": True} if device.type == "cuda" else {"foreach": True}  # as the Engine
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=betas,
                                     weight_decay=weight_decay, **kw)
        self.grad_clip, self.ga = grad_clip, grad_accum

    def step(self, tokens):
        import torch
        import torch.nn.functional as F

        x, y = tokens[:, :-1], tokens[:, 1:]
        for xc, yc in zip(x.chunk(self.ga), y.chunk(self.ga)):
            logits = self.model(xc)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), yc.flatten())
            (loss / self.ga if self.ga > 1 else loss).backward()
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=True)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()  # the last micro-batch's loss


def measure(point: Point | None = None, *, rounds: int = 9, block: int = 8, warmup_blocks: int = 1,
            threads: int | None = 1, label: str = "default study N=1") -> dict:
    """Run the side-by-side comparison; returns the record (times in seconds)."""
    import torch

    from scalestudy.distributed.engine import Engine
    from scalestudy.train import loop as train
    from scalestudy.train.data import SyntheticTokens

    point = _one_process(point or default_point())
    if threads:
        torch.set_num_threads(int(threads))
    tr = point.train
    device = torch.device("cpu")
    cfg = point.model
    rows = point.rows_per_rank
    data = SyntheticTokens(cfg.vocab, cfg.seq_len, seed=tr.seed)
    batches = [data.rows(s, 0, rows).to(device) for s in range(block)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with single_process_group():
        engine = Engine(point, device)
        bare = BareLoop(cfg, device, seed=tr.seed, lr=tr.lr, weight_decay=tr.weight_decay,
                        grad_clip=tr.grad_clip, grad_accum=int(point.grad_accum),
                        betas=tr.betas)

        def run_trainer() -> tuple[float, float, list[float]]:
            sync()
            c0, t0 = time.process_time(), time.perf_counter()
            _, times = train.timed_steps(engine, batches, device)
            sync()
            return time.perf_counter() - t0, time.process_time() - c0, times

        def run_bare() -> tuple[float, float, list[float]]:
            sync()
            c0, t0 = time.process_time(), time.perf_counter()
            for b in batches:
                bare.step(b)
            sync()
            return time.perf_counter() - t0, time.process_time() - c0, []

        for _ in range(warmup_blocks):
            run_trainer()
            run_bare()
        per_round = []
        reported: list[float] = []
        for r in range(rounds):
            order = ("trainer", "bare") if r % 2 == 0 else ("bare", "trainer")
            t, c = {}, {}
            for who in order:
                t[who], c[who], times = run_trainer() if who == "trainer" else run_bare()
                reported += times
            per_round.append({"round": r, "order": "-".join(order),
                              "trainer_block_s": t["trainer"], "bare_block_s": t["bare"],
                              "trainer_block_cpu_s": c["trainer"], "bare_block_cpu_s": c["bare"],
                              "ratio": t["trainer"] / t["bare"],
                              "cpu_ratio": c["trainer"] / c["bare"] if c["bare"] > 0 else None})
        engine.close()

    rec_equiv = equivalence(point, steps=2)

    def summary(key):
        xs = [x[key] for x in per_round if x[key] is not None]
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        return statistics.median(xs) - 1.0, q[0], q[2]

    med = lambda k: statistics.median(x[k] for x in per_round) / block  # noqa: E731
    overhead, q25, q75 = summary("ratio")
    cpu_overhead, cq25, cq75 = summary("cpu_ratio")
    t_trainer, t_bare = med("trainer_block_s"), med("bare_block_s")
    c_trainer, c_bare = med("trainer_block_cpu_s"), med("bare_block_cpu_s")
    rec = {
        "label": label, "point_id": point.point_id, "model": point.to_json()["model"],
        "rows_per_step": rows, "grad_accum": point.grad_accum, "threads": torch.get_num_threads(),
        "rounds": rounds, "block_steps": block, "warmup_blocks": warmup_blocks,
        "trainer_step_s": t_trainer, "bare_step_s": t_bare,
        "trainer_step_cpu_s": c_trainer, "bare_step_cpu_s": c_bare,
        "trainer_reported_step_median_s": statistics.median(reported) if reported else None,
        "overhead": overhead, "ratio_q25": q25, "ratio_q75": q75,
        "cpu_overhead": cpu_overhead, "cpu_ratio_q25": cq25, "cpu_ratio_q75": cq75,
        "rounds_detail": per_round, "equivalence": rec_equiv,
    }
    rec["figures"] = [
        figure("trainer", f"step-time overhead vs bare loop, wall clock ({label})", overhead,
               "fraction", TARGET_OVERHEAD, "<=",
               f"trainer {t_trainer * 1e3:.2f} ms/step, bare {t_bare * 1e3:.2f} ms/step; "
               f"ratio IQR {q25:.3f}-{q75:.3f} over {rounds} alternating rounds of {block} step(s)"),
        figure("trainer", f"step-time overhead vs bare loop, process CPU time ({label})",
               cpu_overhead, "fraction", TARGET_OVERHEAD, "<=",
               f"trainer {c_trainer * 1e3:.2f} ms/step, bare {c_bare * 1e3:.2f} ms/step of CPU "
               f"({rec['threads']} thread); ratio IQR {cq25:.3f}-{cq75:.3f}; unaffected by "
               "other tenants' load, unlike the wall clock"),
    ]
    return rec


def equivalence(point: Point | None = None, steps: int = 3) -> dict:
    """Check that the two loops do the same work: from the same initial weights, on the same
    batches, after ``steps`` steps the losses and parameters of the engine and the bare loop
    agree (fp32 on CPU: expect ~1e-6; losses compared when grad_accum == 1). Returns the
    largest absolute differences."""
    import torch

    from scalestudy.distributed.engine import Engine
    from scalestudy.train import loop as train
    from scalestudy.train.data import SyntheticTokens

    point = _one_process(point or default_point())
    tr = point.train
    device = torch.device("cpu")
    cfg = point.model
    rows = point.rows_per_rank
    data = SyntheticTokens(cfg.vocab, cfg.seq_len, seed=tr.seed)
    batches = [data.rows(s, 0, rows) for s in range(steps)]
    with single_process_group():
        engine = Engine(point, device)
        bare = BareLoop(cfg, device, seed=tr.seed, lr=tr.lr, weight_decay=tr.weight_decay,
                        grad_clip=tr.grad_clip, grad_accum=int(point.grad_accum),
                        betas=tr.betas)
        losses_e, _ = train.timed_steps(engine, batches, device)
        losses_b = [bare.step(b) for b in batches]
        pe = dict(engine.named_params)  # names as in the single-process model's state_dict
        bp = dict(bare.model.named_parameters())
        if set(pe) != set(bp):
            raise RuntimeError(f"engine and bare loop parameters differ: {sorted(set(pe) ^ set(bp))}")
        diff = max(float((pe[k].detach() - p.detach()).abs().max()) for k, p in bp.items())
        engine.close()
    return {"steps": steps,
            "loss_max_abs_diff": (max(abs(float(a) - float(b)) for a, b in zip(losses_e, losses_b))
                                  if point.grad_accum == 1 else None),
            "param_max_abs_diff": diff}
