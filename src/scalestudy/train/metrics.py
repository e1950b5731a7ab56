"""Time training steps and write ``steps.jsonl`` from any training script.

The file's contract is ``scalestudy.record.steps``. A ``command`` workload
(``scalestudy.run.workload``) writes it into ``$SCALESTUDY_POINT_DIR``; the easiest way is
:class:`StepLogger`::

    from scalestudy.train.metrics import StepLogger

    log = StepLogger(device=device, tokens_per_step=global_batch * seq_len)
    for step in range(steps):
        with log.step() as s:          # device synchronised, clock read, ... , synchronised
            loss = train_one_step()    # every micro-batch and the optimizer step
            s.loss = loss              # a tensor is fine: read after the clock stopped
    log.close()                        # every rank calls it; rank 0 writes steps.jsonl

``close`` gathers the ranks' times (per step their mean: ``record.steps.rank_step_time``),
writes the file
atomically (complete or absent, never half-written) and only once. Outside scalestudy (no
``SCALESTUDY_POINT_DIR`` and no ``point_dir``) nothing is written. Torch is imported only when
a device or a process group is involved, so the module itself is cheap to import.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from scalestudy.record.steps import (POINT_DIR_ENV, STEPS_FILE, merge_ranks, step_record,
                                     write_steps)


def synchronize(device) -> None:
    """Wait for ``device``'s queued work: CUDA (ROCm too) and other accelerators with a
    ``torch.<type>.synchronize``; a no-op on CPU, whose ops run synchronously."""
    if device is None:
        return
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":
        backend = getattr(torch, device.type, None)
        if backend is not None and hasattr(backend, "synchronize"):
            backend.synchronize()


class StepTimer:
    """Wall time of a block with ``device`` synchronised before each clock read::

        timer = StepTimer(device)
        with timer:
            ...
        timer.last  # seconds
    """

    def __init__(self, device=None):
        self.device = device
        self.last: float | None = None
        self._t0 = 0.0

    def __enter__(self) -> "StepTimer":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.last = time.perf_counter() - self._t0


class _Step:
    """What the body of ``StepLogger.step()`` may set: ``loss`` and ``tokens``."""

    __slots__ = ("loss", "tokens")

    def __init__(self, tokens):
        self.loss = None
        self.tokens = tokens


class StepLogger:
    """Collects one record per optimizer step and writes ``steps.jsonl`` once, at
    :meth:`close` (see the module doc).

    ``point_dir``: where to write (default ``$SCALESTUDY_POINT_DIR``; neither: nothing is
    written). ``device``: synchronised around each step and, for CUDA, read for peak
    memory. ``tokens_per_step``: tokens of one optimizer step, all ranks together (or set
    ``s.tokens`` per step)."""

    def __init__(self, point_dir: str | os.PathLike | None = None, *, device=None,
                 tokens_per_step: int | None = None):
        point_dir = point_dir or os.environ.get(POINT_DIR_ENV)
        self.path = Path(point_dir) / STEPS_FILE if point_dir else None
        self.device = device
        self.tokens_per_step = tokens_per_step
        self.times: list[float] = []
        self.losses: list = []
        self.tokens: list = []
        self.closed = False

    def step(self):
        """A context manager timing one optimizer step; yields an object whose ``loss`` (and
        ``tokens``) the body sets."""
        logger = self

        class _Ctx:
            def __enter__(self):
                self.rec = _Step(logger.tokens_per_step)
                self.timer = StepTimer(logger.device).__enter__()
                return self.rec

            def __exit__(self, exc_type, *rest):
                self.timer.__exit__(exc_type, *rest)
                if exc_type is None:
                    logger.log(self.timer.last, self.rec.loss, self.rec.tokens)
                return False

        return _Ctx()

    def log(self, step_time_s: float, loss=None, tokens: int | None = None) -> None:
        """Record a step timed by the caller (device synchronised before each clock read)."""
        if self.closed:
            raise RuntimeError("StepLogger.log after close()")
        tokens = self.tokens_per_step if tokens is None else tokens
        if tokens is None:
            raise ValueError("StepLogger: tokens per step unknown; pass tokens_per_step= or "
                             "set s.tokens")
        self.times.append(float(step_time_s))
        self.losses.append(loss)
        self.tokens.append(tokens)

    def _peak_memory(self) -> int | None:
        if self.device is None:
            return None
        import torch

        device = torch.device(self.device)
        if device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(device))
        return None

    def records(self) -> list[dict]:
        """This rank's records (losses read now, after timing)."""
        peak = self._peak_memory()
        return [step_record(i, t, None if loss is None else float(loss), tok,
                            peak_memory_bytes=peak)
                for i, (t, loss, tok) in enumerate(zip(self.times, self.losses, self.tokens))]

    def close(self) -> list[dict] | None:
        """Gather every rank's records (the ranks' mean time per step, the mean loss of
        the ranks that know it, the largest peak memory) and write ``steps.jsonl`` on rank 0,
        atomically. A collective when ``torch.distributed`` is initialised: every rank calls
        it. Returns the written records (rank 0) or None."""
        if self.closed:
            return None
        self.closed = True
        mine = self.records()
        gathered, rank = [mine], 0
        import sys

        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            rank = dist.get_rank()
        if rank != 0:
            return None
        merged = merge_ranks(gathered)
        if self.path is not None:
            write_steps(self.path, merged)
        return merged


__all__ = ["StepLogger", "StepTimer", "synchronize"]
