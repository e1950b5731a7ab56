"""``tune/trials.csv``: the record of a layout search (``scalestudy tune --measure``), one row
per evaluation of a trial (a layout at one fidelity), and its one reader.

A trial's ``state`` at that evaluation (:class:`TrialState`): ``promoted`` to the next rung,
``pruned`` there (successive halving), ``complete`` at full length, a failed run's own state
(``oom``, ``timeout``, ``crashed``, ``invalid``: the search was told zero throughput), or
``short_of_memory`` (it ran, but left less memory free than ``tune.memory_left_gb``: told
zero), ``refused`` (the constraints or the memory model refused the layout: nothing ran) and
``duplicate`` (the layout was measured by an earlier trial: its result, nothing ran)."""

from __future__ import annotations

import math
import os
from enum import StrEnum
from pathlib import Path

from scalestudy.config import settings
from scalestudy.config.parts import TUNED_SETTINGS, section_of
from scalestudy.record.bounded_read import RecordError
from scalestudy.record.states import FAILED, RunState


#: The search's folder, its record and the best layout as a study, relative to the study folder.
TUNE_DIR = Path("tune")
TRIALS = TUNE_DIR / "trials.csv"
BEST_STUDY = TUNE_DIR / "best.yaml"


class TrialState(StrEnum):
    """What the search made of one evaluation (module doc)."""

    COMPLETE = "complete"
    PROMOTED = "promoted"
    PRUNED = "pruned"
    REFUSED = "refused"
    DUPLICATE = "duplicate"
    SHORT_OF_MEMORY = "short_of_memory"  # ran, but left less than tune.memory_left_gb free
    OOM = RunState.OOM.value
    TIMEOUT = RunState.TIMEOUT.value
    CRASHED = RunState.CRASHED.value
    INVALID = RunState.INVALID.value


#: The states of an evaluation the search was told zero throughput for: a failed run, and one
#: that left less memory free than the study asks.
FAILED_TRIALS = tuple(TrialState(s.value) for s in FAILED) + (TrialState.INVALID,
                                                               TrialState.SHORT_OF_MEMORY)

#: The columns of trials.csv, in order (units in the names; ``reused``: the point's record
#: existed before the search asked for it, so nothing ran).
TRIAL_COLUMNS = (
    "trial", "layout", "tp", "pp", "cp", "dp", "micro_batch", *TUNED_SETTINGS,
    "steps", "fidelity", "state", "reason",
    "predicted_tokens_per_s_per_device", "measured_tokens_per_s_per_device", "peak_memory_gb",
    "wall_s", "device_hours", "warm_start", "reused", "point_id")

_COUNTS = ("tp", "pp", "cp", "micro_batch",
           *(k for k in TUNED_SETTINGS if settings.value_type(section_of(k), k) is int))
#: Counts that may be empty: a refused layout whose shape does not divide N has no dp, an
#: evaluation that ran nothing no steps.
_OPTIONAL_COUNTS = ("dp", "steps")
_NONNEG = ("predicted_tokens_per_s_per_device", "measured_tokens_per_s_per_device",
           "peak_memory_gb", "wall_s", "device_hours")


def _bad(i: int, col: str, v) -> RecordError:
    return RecordError(f"trials.csv row {i}: {col} {v!r} is not valid; rerun `scalestudy tune "
                       "STUDY --measure` (it rewrites the file from its records)")


def check_trials(df):
    """``df`` (trials.csv read as a table) when every row is sound: the columns, whole counts
    (trial numbers from 0, layout counts from 1), a known state, fidelity in (0, 1], non-negative rates and times; else RecordError
    naming the row and the column."""
    missing = [c for c in TRIAL_COLUMNS if c not in df.columns]
    if missing:
        raise RecordError(f"trials.csv: no column {', '.join(missing)}; rerun `scalestudy tune "
                          "STUDY --measure`")
    states = {s.value for s in TrialState}
    for i, r in enumerate(df.to_dict("records"), 2):
        for c in _COUNTS + _OPTIONAL_COUNTS:
            v = r[c]
            if c in _OPTIONAL_COUNTS and isinstance(v, float) and math.isnan(v):
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 1
                    and float(v).is_integer()):
                raise _bad(i, c, v)
        t = r["trial"]
        if not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0
                and float(t).is_integer()):
            raise _bad(i, "trial", t)
        if r["state"] not in states:
            raise _bad(i, "state", r["state"])
        f = r["fidelity"]
        if not isinstance(f, (int, float)) or (not math.isnan(f) and not 0 < f <= 1):
            raise _bad(i, "fidelity", f)
        for c in _NONNEG:
            v = r[c]
            if not isinstance(v, (int, float)) or (not math.isnan(v) and (v < 0 or math.isinf(v))):
                raise _bad(i, c, v)
    return df


def read_trials(path: str | os.PathLike):
    """trials.csv as a checked table (``check_trials``); None when it does not exist."""
    import pandas as pd

    if not os.path.exists(path):
        return None
    try:
        df = pd.read_csv(path, keep_default_na=True)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise RecordError(f"{path}: cannot be read ({type(e).__name__}); rerun `scalestudy tune "
                          "STUDY --measure`") from None
    return check_trials(df)


def best_complete(df):
    """The row of the best full-fidelity measured trial (highest tokens/s per device), or
    None when no trial completed."""
    done = df[df["state"] == TrialState.COMPLETE.value]
    if done.empty:
        return None
    return done.loc[done["measured_tokens_per_s_per_device"].idxmax()]
