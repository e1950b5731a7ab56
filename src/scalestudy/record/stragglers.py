"""Stragglers: how far a run's ranks were out of step, and which rank held the others up.

The trainer keeps each rank's own time of each step (``scalestudy.train.run_files`` gathers
them to rank 0). In a synchronous step every rank leaves the step's last collective (the
gradient all-reduce) together, so a rank that reaches a step late lengthens its peers' times
(they wait for it inside theirs) and not its own: the rank that held the others up is the
one with the *shortest* time, and the step took the longest time any rank measured.

Definition (one per run, ``summary.json``'s ``stragglers``, :func:`rank_spread`):

- per steady-state step (warm-up steps dropped): the ratio of the slowest rank's step time to
  the fastest rank's (>= 1; 1: the ranks in lockstep);
- ``rank_spread``: the median of those ratios over the steady steps;
- ``straggler_rank``: the rank that was the fastest (the late one) in most steady steps (the
  lower rank on a tie), ``straggler_share`` the fraction of steady steps it was, and
  ``straggler_host`` its host (``env.json``'s ``ranks``);
- ``steps``: the steady steps counted.

A run is flagged when ``rank_spread`` exceeds the study's ``platform.straggler_ratio`` and
one rank held the others up in at least :data:`MIN_SHARE` of the steady steps
(:func:`flagged`): a late rank that changes from step to step is the host's scheduling (more
processes than cores: 4 processes on 2 cores measured a spread of 1.77 with the late rank's
share 0.38), not a straggler: it stays ``ok`` (its data is real), the tables show the flag and
:func:`note`, and the runner spends one of the point's ``retries`` on it.

Why not slowest over median: with one late rank among N > 2 the median rank waited too, so
slowest / median stays 1; slowest / fastest sees it at any N. Limits: a rank slow *inside*
its step (a slow device, a throttled core) makes every rank's step equally long, which no
ratio of step times can see (the node health check times each node on its own); one rank
alone has no spread (no record).
"""

from __future__ import annotations

import math
from statistics import median

from scalestudy.record.bounded_read import is_int, is_number
from scalestudy.config.parts import STRAGGLER_RATIO

#: The key of ``summary.json`` that holds a run's record (absent: one rank, or no per-rank
#: times, e.g. a command workload).
SUMMARY_KEY = "stragglers"
#: The study setting that sets the threshold (for the notes).
SETTING = "platform.straggler_ratio"


def rank_spread(per_rank: list[list[float]], hosts: list[str], warmup_steps: int = 0
                ) -> dict | None:
    """The stragglers record of a run (module doc) from ``per_rank[r][s]``, rank r's time of
    step s (seconds), and ``hosts[r]``; the first ``warmup_steps`` steps are dropped. None
    with fewer than two ranks or no steady step with all times > 0."""
    if len(per_rank) < 2:
        return None
    ratios, late = [], [0] * len(per_rank)
    for s in range(warmup_steps, min(len(t) for t in per_rank)):
        times = [t[s] for t in per_rank]
        fastest = min(times)
        if not (fastest > 0 and all(math.isfinite(x) for x in times)):
            continue
        ratios.append(max(times) / fastest)
        late[times.index(fastest)] += 1
    if not ratios:
        return None
    rank = late.index(max(late))
    return {"rank_spread": float(median(ratios)), "straggler_rank": rank,
            "straggler_share": late[rank] / len(ratios), "straggler_host": str(hosts[rank]),
            "steps": len(ratios)}


def record_problem(rec) -> str | None:
    """What is wrong with a ``stragglers`` record (the field and the range), or None when it
    is sound or absent."""
    if rec is None:
        return None
    if not isinstance(rec, dict):
        return "is not an object"
    checks = {
        "rank_spread": (lambda v: is_number(v) and v >= 1, "a number >= 1"),
        "straggler_rank": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
        "straggler_share": (lambda v: is_number(v) and 0 < v <= 1, "a fraction in (0, 1]"),
        "straggler_host": (lambda v: isinstance(v, str), "text"),
        "steps": (lambda v: is_int(v) and v > 0, "an integer > 0"),
    }
    for key, (ok, what) in checks.items():
        if key not in rec:
            return f"{key} missing"
        if not ok(rec[key]):
            return f"{key} {rec[key]!r:.40} is not {what}"
    return None


def threshold(point: dict | None) -> float:
    """The point's ``platform.straggler_ratio`` (``point.json``; the default when the point
    predates the setting)."""
    value = ((point or {}).get("platform") or {}).get("straggler_ratio")
    return float(value) if is_number(value) else STRAGGLER_RATIO


#: The least share of steady steps in which one rank held the others up, for a flag.
MIN_SHARE = 0.5


def flagged(rec: dict | None, threshold: float) -> bool:
    """The run's ranks were further out of step than ``threshold`` allows (``rank_spread >
    threshold``), one rank holding the others up in at least :data:`MIN_SHARE` of the steady
    steps; False without a record."""
    return bool(rec) and rec["rank_spread"] > threshold and rec["straggler_share"] >= MIN_SHARE


def note(rec: dict, threshold: float) -> str:
    """One line on a flagged run: the rank that held the others up, its host, the spread."""
    return (f"straggler: rank {rec['straggler_rank']} on {rec['straggler_host'] or '?'} held "
            f"the others up in {rec['straggler_share']:.0%} of {rec['steps']} steady steps; "
            f"slowest/fastest rank step time {rec['rank_spread']:.2f} (median) > {SETTING} "
            f"{threshold:g}")


def columns(rec: dict | None, threshold: float) -> dict:
    """The ``runs.csv`` columns of a run's record: ``rank_spread``, ``straggler_rank``,
    ``straggler_host``, ``straggler`` (the flag) and ``straggler_note`` (:func:`note` when
    flagged, else empty); all empty without a record."""
    if not rec:
        return dict.fromkeys(RUNS_COLUMNS)
    flag = flagged(rec, threshold)
    return {"rank_spread": rec["rank_spread"], "straggler_rank": rec["straggler_rank"],
            "straggler_host": rec["straggler_host"], "straggler": flag,
            "straggler_note": note(rec, threshold) if flag else ""}


#: The ``runs.csv`` columns (:func:`columns`).
RUNS_COLUMNS = ("rank_spread", "straggler_rank", "straggler_host", "straggler", "straggler_note")


# --- the trace's reading -------------------------------------------------------------------

#: The waiting terms a late rank spends least in (a peer's wait, a stage's bubble).
_WAITS = ("sync_wait_s", "pp_bubble_s")


def trace_straggler(per_rank: dict[int, dict], peers_of, threshold: float,
                    least_share: dict[int, float] | None = None) -> dict | None:
    """The trace's straggler of a run, or None where it names none. ``per_rank[r]``: rank r's
    whole step (``terms``, ``step_s``, seconds); ``peers_of(r)``: a key equal for the ranks
    that do the same work (one pipeline stage's); ``threshold``: the study's
    ``platform.straggler_ratio``; ``least_share[r]``: the share of profiled steps in which r
    waited least among its peers. Among each group of peers the rank that waited least is
    the straggler when

    - its own work (``record.terms.WORK_TERMS``) exceeds its peers' median by more than
      ``threshold - 1`` of it and its peers waited about that delay (half to twice) beyond
      its own wait (a delay inside its step: a slow device, a throttled core), or
    - it waited least in every profiled step (at least two) and its peers waited more than
      ``threshold - 1`` of its step beyond its own wait (a delay outside its traced step).

    ``{rank, delay_s, slowed_term, peers_wait_s}``: its work beyond its peers' (s), the work
    term that grew most (None: the delay was outside its traced step), and the peers' mean
    wait beyond its own (s)."""
    from scalestudy.record.terms import WORK_TERMS

    groups: dict = {}
    for r in per_rank:
        groups.setdefault(peers_of(r), []).append(r)
    found = None
    for ranks in groups.values():
        if len(ranks) < 2:
            continue
        wait = {r: sum(per_rank[r]["terms"][k] for k in _WAITS) for r in ranks}
        late = min(ranks, key=lambda r: (wait[r], r))
        others = [r for r in ranks if r != late]
        work = {r: sum(per_rank[r]["terms"][k] for k in WORK_TERMS) for r in ranks}
        base = median(work[r] for r in others)
        delay = work[late] - base
        peers_wait = sum(wait[r] for r in others) / len(others) - wait[late]
        # (its grown work must be what its peers waited for: not a rank whose work grew but
        # held nobody up, nor a few ms of noise beside a long wait from outside its step)
        inside = (base > 0 and delay > (threshold - 1) * base
                  and 0.5 * delay <= peers_wait <= 2 * delay)
        outside = ((least_share or {}).get(late, 0.0) >= 1.0
                   and peers_wait > (threshold - 1) * per_rank[late]["step_s"])
        if not (inside or outside):
            continue
        grew = {k: per_rank[late]["terms"][k] - median(per_rank[r]["terms"][k] for r in others)
                for k in WORK_TERMS}
        rec = {"rank": late, "delay_s": max(0.0, delay),
               "slowed_term": max(grew, key=grew.get) if inside else None,
               "peers_wait_s": peers_wait}
        if found is None or rec["peers_wait_s"] > found["peers_wait_s"]:
            found = rec
    return found
