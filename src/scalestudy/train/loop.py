"""Train one sweep point under torchrun and write its run record.

    torchrun ... -m scalestudy.train RUN_DIR/point.json RUN_DIR

The only code that talks to devices (with ``scalestudy.models`` and
``scalestudy.distributed``). Every rank trains; rank 0 writes ``steps.jsonl``,
``summary.json`` and ``env.json`` (``scalestudy.train.run_files``). Timing: the device is
synchronised before each clock read; a step is the optimizer step over the whole global batch
(all micro-batches); its time is the mean of the ranks' times
(``scalestudy.record.steps.rank_step_time``); the first ``warmup_steps`` are marked
and excluded from the summary. With ``profile`` on, more steps follow the timed window under
``torch.profiler`` (``scalestudy.train.profile``). The runner (``scalestudy.run.runner``)
writes ``status.json`` after this process ends.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from scalestudy.config.point import Point
from scalestudy.distributed.engine import Engine
from scalestudy.train import energy
from scalestudy.train.data import SyntheticTokens
from scalestudy.train.device import (cpu_rss_bytes, local_device, peak_memory_bytes,
                                     process_group_backend, resolve_device_type)
from scalestudy.train.metrics import StepTimer
from scalestudy.train.hooks import step_hook
from scalestudy.train.profile import profiled_steps
from scalestudy.train.run_files import rank_view, write_record


def timed_steps(engine: Engine, batches: list[torch.Tensor], device: torch.device,
                before_step: Callable[[int], None] | None = None) -> tuple[list, list[float]]:
    """The timed loop: one ``engine.train_step`` per batch, the device synchronised before
    each clock read. Returns (losses as returned by the engine, step times in seconds); no
    host sync or collective beyond that inside the loop. ``before_step(i)`` runs untimed."""
    losses, times = [], []
    timer = StepTimer(device)
    for i, batch in enumerate(batches):
        if before_step is not None:
            before_step(i)
        with timer:
            loss = engine.train_step(batch)
        times.append(timer.last)
        losses.append(loss)
    return losses, times


def run(point: Point, run_dir: Path) -> None:
    """Train ``point`` on this rank (inside torchrun) and, on rank 0, write its record."""
    t_start = time.perf_counter()
    plat, tr = point.platform, point.train
    device_type = resolve_device_type(plat.device)
    device = local_device(device_type)
    backend = process_group_backend(device_type)
    dist.init_process_group(backend, timeout=timedelta(seconds=plat.collective_timeout_s),
                            device_id=device if backend == "nccl" else None)
    rank = dist.get_rank()

    cpu_baseline = cpu_rss_bytes() if device_type == "cpu" else 0
    engine = Engine(point, device)

    data = SyntheticTokens(point.model.vocab, point.seq_len, seed=tr.seed)
    rows = point.rows_per_rank
    # every batch made before its step (the timed and the profiled): no step makes its data
    n_prof = point.profile.total_steps if point.profile.enabled else 0
    batches = [data.rows(s, engine.dp_rank * rows, rows).to(device)
               for s in range(tr.steps + n_prof)]
    # energy counters (train/energy.py): read in the untimed hook, after any other hook
    meter = energy.StepEnergy.for_device(device)
    hook = step_hook(point, rank)
    losses, times = timed_steps(engine, batches[:tr.steps], device,
                                energy.chain(hook, meter.mark))
    meter.mark()  # the end of the last step
    traced = None
    if point.profile.enabled:  # after the timed window: its times stay what they are
        step = engine.train_step
        traced = profiled_steps(lambda i: step(batches[i]), point, rank, device, run_dir,
                                times, hook)

    # One gather at the end: no host sync or collective inside the timed loop.
    have_loss = losses[0] is not None
    local = {"times": times, "losses": [float(x) for x in losses] if have_loss else None,
             "memory": peak_memory_bytes(device, cpu_baseline), "view": rank_view(device),
             "reserved": (int(torch.cuda.max_memory_reserved(device))
                          if device.type == "cuda" else None),
             "energy": meter.record(), "profile": traced}
    gathered: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, local)

    if rank == 0:
        write_record(point, run_dir, gathered, device, backend, t_start)
    dist.barrier()
    engine.close()
    del engine
    dist.destroy_process_group()
