"""The ``steps.jsonl`` contract: the file's name, the one line per step, writing it.

``steps.jsonl`` holds one JSON object per line, one line per optimizer step, in step order:

====================  =====================================================================
``step``              int, the optimizer step (0-based)
``step_time_s``       float > 0: wall time of the whole optimizer step (every micro-batch,
                      the optimizer update), the device synchronised before each clock read;
                      with several ranks the mean of the ranks' times (``rank_step_time``)
``loss``              float or null: the step's mean training loss (nats); null when
                      unknown or not finite
``loss_nonfinite``    optional text, ``"nan"``, ``"inf"`` or ``"-inf"``: the step's loss was
                      not a finite number (the run diverged; ``loss`` is then null, so the
                      line stays valid JSON; ``scalestudy.record.loss``). Absent for a
                      finite or unknown loss
``tokens``            int > 0: tokens the step trained, all ranks together
                      (global batch × sequence length)
``peak_memory_bytes`` optional int: the most any rank's device allocated
``warmup``            optional bool: excluded from timing (scalestudy sets it from the
                      point's ``train.warmup_steps``: the first steps are warm-up)
====================  =====================================================================

The built-in trainer writes it through :func:`step_record` and :func:`write_steps`, a command
workload through ``scalestudy.train.metrics.StepLogger``; the runner rewrites it with the
warm-up flags. ``scalestudy.record.run_records`` reads and checks it (``parse_steps``,
``read_steps``): the one reader of the trainer, the runner, aggregate and status.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from scalestudy.number_format import whole
from scalestudy.record.io import write_text
from scalestudy.record.loss import loss_fields, nonfinite_loss

STEPS_FILE = "steps.jsonl"
#: the environment variable naming a command workload's point folder
POINT_DIR_ENV = "SCALESTUDY_POINT_DIR"


def rank_step_time(times: list[float]) -> float:
    """One step's time (s) from each rank's own time for it: their mean.

    Each rank times its step from its own start, and the ranks start a step at different
    moments (a rank still in its optimizer, a process the OS has not scheduled yet), so a
    delay shows in one rank's step and in the others' next one. The mean over ranks counts
    it once: summed over the steps it is the average rank's wall time, which is the run's
    (to within one step's skew at its two ends). The maximum over ranks counts it in both
    steps: on the 2-core development host, 4 and 8 data-parallel processes took 34.4 and
    64.5 ms a step by the wall clock, while the median of the per-step maximum read 41.9 and
    90.2 ms (+22%, +40%); with ranks in lockstep (one process per accelerator, no
    oversubscription) the two agree."""
    return sum(times) / len(times)


def step_record(step: int, step_time_s: float, loss: float | None, tokens: int | float,
                warmup: bool | None = None, peak_memory_bytes: int | None = None) -> dict:
    """One line of ``steps.jsonl`` (see the module doc for the keys; a NaN or infinite
    loss: ``record.loss.loss_fields``)."""
    rec = {"step": int(step), "step_time_s": float(step_time_s), **loss_fields(loss),
           "tokens": whole(tokens)}
    if warmup is not None:
        rec["warmup"] = bool(warmup)
    if peak_memory_bytes is not None:
        rec["peak_memory_bytes"] = int(peak_memory_bytes)
    return rec


def steps_text(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def write_steps(path: str | os.PathLike, records: list[dict]) -> Path:
    """Write ``records`` as ``steps.jsonl`` at ``path`` (a folder: its ``steps.jsonl``),
    atomically."""
    path = Path(path)
    if path.is_dir():
        path = path / STEPS_FILE
    return write_text(path, steps_text(records))


def merge_ranks(per_rank: list[list[dict]]) -> list[dict]:
    """One record per step from every rank's records: the ranks' time (``rank_step_time``),
    the mean loss over the ranks that report one (not finite when any rank's was not), the
    largest peak memory, rank 0's tokens."""
    n = min(len(r) for r in per_rank) if per_rank else 0
    out = []
    for i in range(n):
        recs = [r[i] for r in per_rank]
        losses = [float(nonfinite_loss(r) or r["loss"]) for r in recs
                  if r.get("loss") is not None or nonfinite_loss(r)]
        peaks = [r["peak_memory_bytes"] for r in recs if r.get("peak_memory_bytes") is not None]
        out.append(step_record(recs[0]["step"], rank_step_time([r["step_time_s"] for r in recs]),
                               sum(losses) / len(losses) if losses else None, recs[0]["tokens"],
                               recs[0].get("warmup"), max(peaks) if peaks else None))
    return out
