"""``summary.json``'s ``profile`` record: what the profiled steps after the timed window did
on each rank (``scalestudy.train.profile``), and its check for the one reader
(``scalestudy.record.run_records``)."""

from __future__ import annotations

import math

#: The key of ``summary.json`` holding the record: per rank whether it traced, its trace's
#: size or why it has none, the median of its profiled steps and of its timed steady steps,
#: the median time its training thread waited for a core per traced step and the profiler's
#: measured cost per recorded event (``event_cost_s``; None: unknown).
PROFILE_KEY = "profile"


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def profile_problem(rec) -> str | None:
    """What is wrong with ``summary.json``'s ``profile`` record (the field and the range), or
    None when it is sound or absent."""
    if rec is None:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("ranks"), list):
        return "is not an object with a list of ranks"
    for i, r in enumerate(rec["ranks"]):
        if not isinstance(r, dict) or not isinstance(r.get("rank"), int) or r["rank"] < 0:
            return f"ranks[{i}] is not a rank's record"
        for k in ("profiled_step_s", "timed_step_s"):
            v = r.get(k)
            if v is not None and not _seconds(v):
                return f"ranks[{i}].{k} {v!r} is not a positive number of seconds"
        cost = r.get("event_cost_s")
        if cost is not None and not (cost == 0 or _seconds(cost)):
            return f"ranks[{i}].event_cost_s {cost!r} is not a number of seconds >= 0"
        wait = r.get("runqueue_wait_s")
        if wait is not None and not (wait == 0 or _seconds(wait)):
            return f"ranks[{i}].runqueue_wait_s {wait!r} is not a number of seconds >= 0"
        step = r.get("profiled_step_s")
        if wait is not None and step is not None and wait > step * (1 + 1e-6):
            return (f"ranks[{i}].runqueue_wait_s {wait!r} is longer than its profiled step "
                    f"({step!r} s): it is read inside the step's timed window")
        if not isinstance(r.get("state"), str) or not isinstance(r.get("traced"), bool):
            return f"ranks[{i}] has no state or traced flag"
    return None
