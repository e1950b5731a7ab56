"""A run's measured step breakdown (``runs/<id>/breakdown.json``): its ranks' profiler traces
read into the named terms of ``scalestudy.record.terms``, and the one reader of that record.

From the traces (``scalestudy.record.trace``, each rank's steps read by
``scalestudy.record.timeline``) to the run's terms:

1. **Waiting for the slowest rank.** A collective cannot finish before its last rank
   arrives: the rank that arrived last held it for the shortest time, which stands for the
   transfer itself; every other rank of the same group waited the difference. Per profiled
   step, each tensor-, data- or context-parallel transfer is paired with the same transfer
   (kind, operation, how-manieth in the step) of the other ranks of its group (the ranks
   sharing every other mesh coordinate: ``config.layout``); of a rank's exposed seconds of it,
   up to that difference (on host traces, no more than until the last rank launched it: a
   rank whose own transfer finished late waited for no one) moves from the kind's exposed
   communication to ``sync_wait_s``; of
   the rest (the bytes moving), what the rank's threads waited for a core to
   ``core_wait_s``. A collective of the optimizer (clipping's norm, over every rank) pairs
   over all ranks; with pipeline stages its waiting is the pipeline's drain
   (``pp_bubble_s``).
2. **The pipeline bubble.** Per profiled step, the shortest lifetime of any send or receive
   of any rank stands for one transfer; what a stage was exposed on its pipeline traffic
   beyond that was the stage waiting for another: ``pp_bubble_s`` (the schedule's fill and
   drain, and every stall where the other stage was late). In a pipeline of two stages each
   send is matched with the other stage's receive of the same how-manieth and the replay
   below reads the waits for a core; with more stages, less what the other stages waited
   for a core beyond its own in the step (``core_wait_s``, an estimate: which send fed which
   receive is not in a gloo trace).
   **Caused by a wait for a core, or by the profiler.** The ranks' profiled steps are
   replayed through their collectives (and a two-stage pipeline's sends and receives)
   without the training threads' waits for a core
   (``record.replay``): what that saves of a rank's waiting moves to ``core_wait_s``; what
   taking the profiler's cost per event out of the replay saves beyond it (a peer's wait for
   a rank's recording) leaves the step with the profiler's own cost.
3. **Per rank**, the mean over its profiled steps of each *whole* step's terms (they add up
   to its mean traced step exactly; never medians taken term by term); **per run**, each
   term's mean over the profiled ranks, with its lowest and highest rank, the rank that
   waited least (its ``sync_wait_s`` the smallest), the trace's straggler
   (``record.stragglers.trace_straggler``), the transfers named by their kernel only (no
   launcher in the trace), and, from ``summary.json``, the ranks' mean time waiting for a
   core per traced step (``runqueue_wait_s``, the training thread's, a cross-check of
   ``core_wait_s``).

Terms are in the trace's seconds, the profiler's cost per recorded event taken out where it
was paid (``raw_step_s`` before, ``profiler_s`` the cost; ``event_cost_s`` measured by each
rank: ``train.profile``); ``scalestudy.analysis.loss_by_term`` sets them against the timed
step. On a device trace, HTA's temporal breakdown stands beside the terms regrouped as HTA
groups time (``record.hta``). A run whose traces are missing, damaged, cut or over their cap gets a record with
``state: empty`` and the reason, never a traceback.
"""

from __future__ import annotations

import glob
import math
import os
from statistics import median

from scalestudy.config.layout import group_key
from scalestudy.record.io import write_json
from scalestudy.record.profile_record import PROFILE_KEY, profile_problem
from scalestudy.record.bounded_read import RecordError, read_object
from scalestudy.record.terms import COMM_TERM, MEASURED_TERMS, OVERLAPPED_TERMS, OVERLAP_TERM
from scalestudy.record import replay, stragglers
from scalestudy.record.kernels import BY_KERNEL_NAME, device_temporal
from scalestudy.record.timeline import StepReading, read_trace_steps
from scalestudy.record.trace import Trace, TraceError, read_trace

#: The record's file in a run folder, and the folder the built-in trainer writes traces to.
BREAKDOWN_FILE = "breakdown.json"
TRACES_DIR = "traces"
#: The built-in trainer's trace file of a rank (gzip'd Kineto JSON).
TRACE_NAME = "rank{rank}.json.gz"
#: Beside it, the run-queue samples of its training thread (``train.profile.RunQueueSampler``).
RUNQUEUE_NAME = "rank{rank}.runqueue.json"
#: Version of the record's layout.
SCHEMA = 1
#: States of the record: the terms were read, or there are none (with the reason).
OK, EMPTY = "ok", "empty"
#: Mesh dimensions of each paired kind's group.
_GROUP_DIMS = {"tp": ("tp",), "dp": ("dp", "cp"), "cp": ("cp",)}


def empty(reason: str, **extra) -> dict:
    """The record of a run without a breakdown, and why."""
    return {"schema": SCHEMA, "state": EMPTY, "reason": reason, **extra}


def trace_files(run_dir: str | os.PathLike, pattern: str | None = None) -> list[str]:
    """The trace files of a run: ``pattern`` (a command workload's ``traces``: a glob
    relative to the run folder, ``**`` allowed), else the built-in trainer's
    ``traces/rank*.json.gz``; sorted."""
    run_dir = os.fspath(run_dir)
    pattern = pattern or os.path.join(TRACES_DIR, "rank*.json.gz")
    return sorted(glob.glob(os.path.join(run_dir, pattern), recursive=True))


def clear_traces(run_dir: str | os.PathLike, pattern: str | None = None) -> None:
    """Remove a previous attempt's traces and run-queue samples (they are not this
    attempt's)."""
    samples = glob.glob(os.path.join(os.fspath(run_dir), TRACES_DIR, "rank*.runqueue.json"))
    for f in trace_files(run_dir, pattern) + samples:
        if os.path.isfile(f) and not os.path.islink(f):
            os.unlink(f)


def runqueue_wait(summary: dict | None) -> float | None:
    """The traced ranks' mean time waiting for a core per traced step (s; ``summary.json``'s
    profile record), or None where a rank has no figure (not Linux, a foreign trainer)."""
    rec = (summary or {}).get(PROFILE_KEY)
    if not isinstance(rec, dict) or profile_problem(rec):
        return None
    waits = [r.get("runqueue_wait_s") for r in rec["ranks"] if r.get("traced")]
    if not waits or None in waits:
        return None
    return sum(waits) / len(waits)


def traced_ranks(summary: dict | None) -> tuple[list[int] | None, str]:
    """The ranks whose traces a built-in run must have, from ``summary.json``'s ``profile``
    record, and why one has none (``""``: every traced rank kept its trace; None: no record,
    take the traces there are)."""
    rec = (summary or {}).get(PROFILE_KEY)
    if not isinstance(rec, dict):
        return None, ""
    ranks = [r for r in rec.get("ranks") or [] if r.get("traced")]
    lost = [r for r in ranks if r.get("state") != OK]
    why = "; ".join(f"rank {r['rank']}: {r.get('reason') or r.get('state')}" for r in lost)
    return [r["rank"] for r in ranks], why


def _layout(point: dict) -> dict:
    return {k: int(point.get(k) or 1) for k in ("dp", "tp", "pp", "cp")}


def _move(terms: dict, src: str, dst: str, seconds: float) -> None:
    terms[src] -= seconds
    terms[dst] += seconds


def _last_pieces(blocked: list[tuple[float, float]], seconds: float):
    """The last ``seconds`` of a transfer's blocked pieces."""
    out, left = [], seconds
    for x, y in reversed(blocked):
        if left <= 0:
            break
        take = min(y - x, left)
        out.append((y - take, y))
        left -= take
    return out


def _bytes_core(reading: StepReading, t, seconds: float) -> float:
    """What the rank's threads waited for a core while a transfer's bytes moved: in the last
    ``seconds`` the rank was blocked on it (its backend threads carry the transfer)."""
    core = reading.core
    if not core:
        return 0.0
    return sum(core.between(x, y, True) for x, y in _last_pieces(t.blocked, seconds))


def _collective_matches(readings: dict[int, list[StepReading]], layout: dict, j: int):
    """``(kind, [(rank, transfer), ...])`` of step ``j``: each collective with its copies on the
    other ranks of its group (the same kind, operation and how-manieth in the step); a
    collective of the optimizer pairs over all ranks."""
    ranks = sorted(readings)
    world = math.prod(layout.get(k, 1) for k in ("dp", "tp", "pp", "cp"))
    fits = all(0 <= r < world for r in ranks) and len(ranks) <= world
    for kind, dims in {**_GROUP_DIMS, "optimizer": None}.items():
        groups: dict = {}
        for r in ranks:
            groups.setdefault(group_key(r, layout, dims) if fits and dims else (), []).append(r)
        for members in groups.values():
            by_key: dict = {}
            for r in members:
                for t in readings[r][j].transfers:
                    if t.kind == kind:
                        by_key.setdefault((t.op, t.index), []).append((r, t))
            for pairs in by_key.values():
                if len(pairs) > 1:
                    yield kind, pairs


def _pipeline_matches(readings: dict[int, list[StepReading]], layout: dict, j: int):
    """Of step ``j``, each send of a two-stage pipeline with the other stage's receive of the
    same how-manieth (the stages post them in the same order); None where a pipeline has
    other than two stages, or its two stages' counts differ (which send fed which receive
    is then not in the trace)."""
    ranks = sorted(readings)
    if layout.get("pp", 1) != 2 or not all(0 <= r < math.prod(layout.values()) for r in ranks):
        return None
    out, stages = [], {}
    for r in ranks:
        stages.setdefault(group_key(r, layout, ("pp",)), []).append(r)
    for pair in stages.values():
        if len(pair) != 2:
            return None
        for a, b in (pair, pair[::-1]):
            sends = [t for t in readings[a][j].transfers if t.kind == "pp" and "send" in t.op]
            recvs = [t for t in readings[b][j].transfers if t.kind == "pp" and "recv" in t.op]
            if len(sends) != len(recvs):
                return None
            out += [[(a, s), (b, t)] for s, t in zip(sends, recvs)]
    return out


def _wait_term(kind: str, layout: dict) -> str:
    """The term a rank's waiting for another rank at a transfer of ``kind`` goes to."""
    if kind == "pp" or (kind == "optimizer" and layout.get("pp", 1) > 1):
        return "pp_bubble_s"
    return "sync_wait_s"


def _clock(step: StepReading) -> float:
    """The step's trace clock against the wall clock (s from the epoch at its time 0)."""
    return step.clock_ns * 1e-9


def _last_launch(readings: dict[int, list[StepReading]], pairs, j: int) -> float | None:
    """When the last rank of a collective launched it (wall clock s, from the epoch), on host
    traces (whose clocks are one host's, or synchronised ones'); None on a device trace."""
    if any(readings[r][j].device is not None for r, _ in pairs):
        return None
    return max(t.start + _clock(readings[r][j]) for r, t in pairs)


def pair_sync_waits(readings: dict[int, list[StepReading]], layout: dict) -> None:
    """Move each rank's waiting for the slowest rank of its groups out of the exposed
    communication into ``sync_wait_s`` (module doc, 1), in place, and of the rest of the
    exposed time (the bytes moving) what the rank's backend threads waited for a core into
    ``core_wait_s``. A collective of the optimizer (clipping's norm, reduced over every rank)
    pairs over all ranks; its waiting is the pipeline's drain (``pp_bubble_s``) when there
    are stages, else ``sync_wait_s``. (What of the waiting a wait for a core caused:
    :func:`core_caused_waits`.)"""
    steps = min(len(v) for v in readings.values())
    for j in range(steps):
        for kind, pairs in _collective_matches(readings, layout, j):
            src = "optimizer_s" if kind == "optimizer" else COMM_TERM[kind]
            late = min(pairs, key=lambda p: p[1].lifetime)[1]
            last = _last_launch(readings, pairs, j)
            for r, t in pairs:
                step = readings[r][j]
                t.waited = min(max(0.0, t.lifetime - late.lifetime), t.exposed)
                if last is not None:  # (no longer than until the last rank launched it)
                    t.waited = min(t.waited, max(0.0, last - t.start - _clock(step)))
                moving = t.exposed - t.waited
                _move(step.terms, src, "core_wait_s", min(moving, _bytes_core(step, t, moving)))
                _move(step.terms, src, _wait_term(kind, layout), t.waited)


def split_pipeline(readings: dict[int, list[StepReading]], layout: dict | None = None) -> None:
    """Of each rank's exposed pipeline traffic, the waiting for another stage moves to
    ``pp_bubble_s``, in place: per step, the shortest lifetime of any send or receive of any
    rank stands for one transfer (a pipeline's activations and gradients are the same size),
    and what a transfer was exposed beyond that was the stage waiting; of the transfer
    itself, what the stage's backend threads waited for a core while its bytes moved goes
    to ``core_wait_s``. Of a stage's bubble, what the other stages of its pipeline waited for
    a core in the step beyond its own wait (the most of any of them) moves on to
    ``core_wait_s``: they were late for want of a core (per step, not per hand-over: an
    estimate, ``record.replay`` says why, and zero on a host whose ranks have cores)."""
    steps = min(len(v) for v in readings.values())
    ranks = sorted(readings)
    world = math.prod((layout or {}).get(k, 1) for k in ("dp", "tp", "pp", "cp"))
    fits = layout is not None and all(0 <= r < world for r in ranks)
    for j in range(steps):
        lives = [t.lifetime for v in readings.values() for t in v[j].transfers if t.kind == "pp"]
        if not lives:
            continue
        one = min(lives)
        for v in readings.values():
            for t in v[j].transfers:
                if t.kind == "pp":
                    t.waited = max(0.0, t.exposed - one)
                    moving = t.exposed - t.waited
                    _move(v[j].terms, "pp_p2p_s", "pp_bubble_s", t.waited)
                    _move(v[j].terms, "pp_p2p_s", "core_wait_s",
                          min(moving, _bytes_core(v[j], t, moving)))
        if layout is not None and _pipeline_matches(readings, layout, j) is not None:
            continue  # (the replay reads its waits for a core: core_caused_waits)
        own = {r: readings[r][j].terms["core_wait_s"] for r in ranks}
        for r in ranks:
            key = group_key(r, layout, ("pp",)) if fits else ()
            others = [own[q] for q in ranks if q != r
                      and (group_key(q, layout, ("pp",)) if fits else ()) == key]
            terms = readings[r][j].terms
            late = min(terms["pp_bubble_s"], max([0.0] + others) - own[r]) if others else 0.0
            if late > 0:
                _move(terms, "pp_bubble_s", "core_wait_s", late)


def core_caused_waits(readings: dict[int, list[StepReading]], layout: dict) -> None:
    """Of each rank's waiting for other ranks at a collective (``sync_wait_s``, or
    ``pp_bubble_s`` at the optimizer's with stages), what the step replayed without any
    training thread's wait for a core saves
    (``record.replay``) moves to ``core_wait_s``, in place, at most what each transfer
    waited; where the replay waits longer (the rank's own wait for a core hid a wait for a
    peer), that much of its ``core_wait_s`` moves back to the waiting. Nothing without the
    run-queue samples."""
    ranks = sorted(readings)
    n = min(len(v) for v in readings.values())
    matches = [pairs for j in range(n) for _, pairs in _collective_matches(readings, layout, j)]
    matches += [pair for j in range(n) for pair in _pipeline_matches(readings, layout, j) or []]
    if not (matches and any(s.core for v in readings.values() for s in v)):
        return
    steps = {r: readings[r][:n] for r in ranks}
    saved = replay.core_saved(steps, matches)
    recorded = replay.profiler_saved(steps, matches)
    for r in ranks:
        for step in steps[r]:
            for t in step.transfers:
                gain = saved.get((r, id(t)), 0.0)
                dst = _wait_term(t.kind, layout)
                if gain > 0:
                    gain = min(gain, t.waited, step.terms[dst])
                    _move(step.terms, dst, "core_wait_s", gain)
                elif gain < 0:
                    _move(step.terms, "core_wait_s", dst, min(-gain, step.terms["core_wait_s"]))
                cost = min(max(0.0, recorded.get((r, id(t)), 0.0)), t.waited - max(0.0, gain),
                           step.terms[dst])
                if cost > 0:  # (a peer's recording held this rank up: the profiler's cost)
                    step.terms[dst] -= cost
                    step.span_s -= cost
                    step.profiler_s += cost


def _rank_record(steps: list[StepReading]) -> dict:
    """A rank's terms: the mean over its profiled steps of each whole step's terms (so they
    add up to its mean traced step exactly, and every rank's come from the same steps)."""
    n = len(steps)
    terms = {k: sum(s.terms[k] for s in steps) / n for k in MEASURED_TERMS}
    terms.update({OVERLAP_TERM[k]: sum(s.overlapped[k] for s in steps) / n for k in OVERLAP_TERM})
    return {"step_s": sum(s.span_s for s in steps) / n,
            "raw_step_s": sum(s.raw_span_s for s in steps) / n,
            "profiler_s": sum(s.profiler_s for s in steps) / n,
            "step_spread_s": max(s.span_s for s in steps) - min(s.span_s for s in steps),
            "events_per_step": float(median(s.events for s in steps)), "steps": n,
            "terms": terms}


def least_waiting_share(readings: dict[int, list[StepReading]], peers) -> dict[int, float]:
    """Per rank, the share of profiled steps in which it waited least (``sync_wait_s`` +
    ``pp_bubble_s``) among its peers (``peers(r)``: equal for the ranks of one stage)."""
    steps = min(len(v) for v in readings.values())
    count = dict.fromkeys(readings, 0)
    groups: dict = {}
    for r in readings:
        groups.setdefault(peers(r), []).append(r)
    for j in range(steps):
        for ranks in groups.values():
            if len(ranks) > 1:
                count[min(ranks, key=lambda r: (readings[r][j].terms["sync_wait_s"]
                                                + readings[r][j].terms["pp_bubble_s"], r))] += 1
    return {r: c / steps for r, c in count.items()} if steps else {}


def event_costs(summary: dict | None) -> dict[int, float]:
    """Each traced rank's measured profiler cost per recorded event (s; ``summary.json``'s
    profile record, ``event_cost_s``); a rank without one is absent."""
    rec = (summary or {}).get(PROFILE_KEY)
    if not isinstance(rec, dict) or profile_problem(rec):
        return {}
    return {r["rank"]: float(r["event_cost_s"]) for r in rec["ranks"]
            if isinstance(r.get("event_cost_s"), (int, float)) and r["event_cost_s"] >= 0}


def runqueue_samples(trace: Trace) -> list[tuple[float, float, float]]:
    """The run-queue samples written beside a built-in trace (:data:`RUNQUEUE_NAME`) on the
    trace's clock, ``(time s, the training thread's cumulative wait s, the other threads')``;
    empty where there are none or they are damaged (the wait is then not taken out, and the
    record says so)."""
    path = os.path.join(os.path.dirname(trace.path), RUNQUEUE_NAME.format(rank=trace.rank))
    try:
        doc = read_object(path)
        rows = [tuple(float(x) for x in row) for row in (doc or {}).get("samples") or []]
        rows = [(t, w, o[0] if o else 0.0) for t, w, *o in rows]
    except (RecordError, TypeError, ValueError):
        return []
    return sorted(((t - trace.base_ns) * 1e-9, w * 1e-9, o * 1e-9) for t, w, o in rows)


def _read_traces(files: list[str]) -> dict[int, list[Trace]]:
    """The traces by rank; a run's only trace that names no rank is rank 0 (one process).
    :class:`TraceError` for a damaged one, or several that name none."""
    traces: dict[int, list[Trace]] = {}
    for f in files:
        tr = read_trace(f)
        if tr.rank is None:
            if len(files) > 1:
                raise TraceError(f"{os.path.basename(f)}: names no rank (no distributedInfo, "
                                 "no rankN in its name) and is one of several traces")
            tr.rank, tr.world_size = 0, tr.world_size or 1
        traces.setdefault(tr.rank, []).append(tr)
    return traces


def run_breakdown(run_dir: str | os.PathLike, point: dict, pattern: str | None = None,
                  expected_ranks: list[int] | None = None) -> dict:
    """The ``breakdown.json`` record of a finished run (module doc), from its traces;
    ``point``: its ``point.json`` object; ``pattern``: where its trainer wrote its traces (a
    command workload's ``traces``); ``expected_ranks``: the ranks that were to write one (a
    missing one empties the record). Never raises for a damaged trace."""
    summary = None
    if expected_ranks is None and pattern is None:
        try:
            summary = read_object(os.path.join(os.fspath(run_dir), "summary.json"))
        except RecordError as e:
            return empty(str(e))
        expected_ranks, lost = traced_ranks(summary)
        if lost:
            return empty(f"no usable trace of {lost}")
    files = trace_files(run_dir, pattern)
    if not files:
        return empty("no trace in the run folder (profiling was off, or the trainer wrote "
                     f"none where {pattern or TRACES_DIR + '/'} says)")
    layout = _layout(point)
    try:
        traces = _read_traces(files)
    except TraceError as e:
        return empty(f"trace unreadable: {e}")
    missing = sorted(set(expected_ranks or ()) - set(traces))
    if missing:
        return empty(f"no trace of rank(s) {', '.join(map(str, missing))}")
    costs = event_costs(summary)
    samples = {r: [runqueue_samples(tr) for tr in trs] for r, trs in traces.items()}
    readings = {r: [s for tr, smp in zip(trs, samples[r])
                    for s in read_trace_steps(tr, layout, costs.get(r, 0.0), smp)]
                for r, trs in traces.items()}
    pair_sync_waits(readings, layout)
    split_pipeline(readings, layout)
    core_caused_waits(readings, layout)
    rec = _record(run_dir, files, traces, readings, layout, summary, costs, point)
    rec["core_wait_placed"] = all(smp for v in samples.values() for smp in v)
    return rec


def device_shares(steps: list[StepReading], traces: list[Trace]) -> dict:
    """A device rank's profiled steps regrouped as HTA's temporal breakdown groups time, over
    the same window HTA reads (seconds): ``span_s`` from the steps' first kernel to their
    last, ``compute_s`` and ``non_compute_s`` summed from the steps' terms
    (``StepReading.device``), ``idle_s`` the rest of the span (between the steps too); and
    the communication's overlap with compute over its last trace (``device_temporal``)."""
    out = {k: sum((s.device or {}).get(k, 0.0) for s in steps)
           for k in ("compute_s", "non_compute_s")}
    spans = [s.device["kernels"] for s in steps if s.device]
    out["span_s"] = (max(b for _, b in spans) - min(a for a, _ in spans)) if spans else 0.0
    out["idle_s"] = max(0.0, out["span_s"] - out["compute_s"] - out["non_compute_s"])
    out["comm_overlap"] = device_temporal(traces[-1]).get("comm_overlap")
    return out


def _record(run_dir, files, traces, readings, layout, summary, costs, point) -> dict:
    """The record of :func:`run_breakdown` from the ranks' paired readings."""
    per_rank = {r: _rank_record(steps) for r, steps in readings.items()}
    ranks = sorted(per_rank)
    keys = MEASURED_TERMS + OVERLAPPED_TERMS
    mean = {k: sum(per_rank[r]["terms"][k] for r in ranks) / len(ranks) for k in keys}
    least = min(ranks, key=lambda r: (per_rank[r]["terms"]["sync_wait_s"],
                                      per_rank[r]["step_s"], r))
    fits = len(ranks) <= math.prod(layout.values()) and all(
        0 <= r < math.prod(layout.values()) for r in ranks)

    def peers(r: int) -> tuple:
        return group_key(r, layout, ("dp", "tp", "cp")) if fits else ()

    late = stragglers.trace_straggler(per_rank, peers, stragglers.threshold(point),
                                      least_waiting_share(readings, peers))
    gpu = any(tr.on_gpu for trs in traces.values() for tr in trs)
    by_name = sorted({t.op for v in readings.values() for s in v for t in s.transfers
                      if t.named_by == BY_KERNEL_NAME})
    rec = {"schema": SCHEMA, "state": OK, "reason": "", "device": "gpu" if gpu else "cpu",
           "ranks": ranks, "profiled_steps": min(p["steps"] for p in per_rank.values()),
           "step_choice": "the mean over the profiled steps of each whole step",
           "step_s": sum(mean[k] for k in MEASURED_TERMS), "terms": mean,
           "raw_step_s": sum(per_rank[r]["raw_step_s"] for r in ranks) / len(ranks),
           "profiler_s": sum(per_rank[r]["profiler_s"] for r in ranks) / len(ranks),
           "event_cost_s": (sum(costs.values()) / len(costs)) if costs else None,
           "terms_min": {k: min(per_rank[r]["terms"][k] for r in ranks) for k in keys},
           "terms_max": {k: max(per_rank[r]["terms"][k] for r in ranks) for k in keys},
           "rank_waited_least": least, "straggler": late,
           "runqueue_wait_s": runqueue_wait(summary),
           "named_by_kernel": by_name,
           "per_rank": {str(r): per_rank[r] for r in ranks},
           "files": [os.path.relpath(f, run_dir) for f in files]}
    if gpu:
        rec["temporal"] = {str(r): device_shares(readings[r], trs) for r, trs in traces.items()}
        from scalestudy.record.hta import cross_check

        rec["hta"] = cross_check(files, rec["temporal"])
    return rec


def write_breakdown(run_dir: str | os.PathLike, point: dict, pattern: str | None = None,
                    expected_ranks: list[int] | None = None) -> dict:
    """:func:`run_breakdown`, written atomically to the run folder's ``breakdown.json``."""
    rec = run_breakdown(run_dir, point, pattern, expected_ranks)
    write_json(os.path.join(os.fspath(run_dir), BREAKDOWN_FILE), rec)
    return rec


# --- the reader --------------------------------------------------------------------------


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_breakdown(rec: dict) -> str | None:
    """What is wrong with a ``breakdown.json`` object (the field and the range), or None."""
    if rec.get("schema") != SCHEMA:
        return f"schema {rec.get('schema')!r} is not {SCHEMA}"
    if rec.get("state") not in (OK, EMPTY):
        return f"state {rec.get('state')!r} is not {OK} or {EMPTY}"
    if rec["state"] == EMPTY:
        return None if isinstance(rec.get("reason"), str) else "reason is not text"
    step = rec.get("step_s")
    if not (_seconds(step) and step > 0):
        return f"step_s {step!r} is not a positive number of seconds"
    for name in ("terms", "terms_min", "terms_max"):
        table = rec.get(name)
        if not isinstance(table, dict):
            return f"{name} is not a table of seconds"
        for k in MEASURED_TERMS + OVERLAPPED_TERMS:
            v = table.get(k)
            # (a term may be a hair below 0: the pairing moves seconds between terms)
            if not (_seconds(v) and v >= -1e-9 * step and v <= 1e7):
                return f"{name}.{k} {v!r} is not a number of seconds >= 0"
    if abs(sum(rec["terms"][k] for k in MEASURED_TERMS) - step) > 1e-6 * step:
        return "terms do not add up to step_s"
    ranks = rec.get("ranks")
    if not (isinstance(ranks, list) and ranks and all(isinstance(r, int) and r >= 0
                                                       for r in ranks)):
        return "ranks is not a list of ranks"
    if rec.get("rank_waited_least") not in ranks:
        return "rank_waited_least is not one of its ranks"
    wait = rec.get("runqueue_wait_s")
    if wait is not None and not (_seconds(wait) and wait >= 0):
        return f"runqueue_wait_s {wait!r} is not a number of seconds >= 0 or null"
    return _check_additions(rec, step)


def _check_additions(rec: dict, step: float) -> str | None:
    """:func:`check_breakdown` of the fields beside the terms: the raw traced step and the
    profiler's cost, the straggler, the transfers named by their kernel, HTA's reading."""
    raw, cost = rec.get("raw_step_s", step), rec.get("profiler_s", 0.0)
    if not (_seconds(raw) and raw >= step * (1 - 1e-9)):
        return f"raw_step_s {raw!r} is not a number of seconds >= step_s"
    if not (_seconds(cost) and 0 <= cost <= raw):
        return f"profiler_s {cost!r} is not a number of seconds in [0, raw_step_s]"
    late = rec.get("straggler")
    if late is not None:
        if not (isinstance(late, dict) and late.get("rank") in rec["ranks"]
                and all(_seconds(late.get(k)) for k in ("delay_s", "peers_wait_s"))
                and late["delay_s"] >= 0
                and (late.get("slowed_term") is None or late["slowed_term"] in MEASURED_TERMS)):
            return "straggler is not null or {rank of its ranks, delay_s, peers_wait_s, " \
                   "slowed_term}"
    named = rec.get("named_by_kernel", [])
    if not (isinstance(named, list) and all(isinstance(x, str) for x in named)):
        return "named_by_kernel is not a list of names"
    return _check_hta(rec.get("hta"), rec.get("temporal"))


def _check_hta(h, temporal) -> str | None:
    if h is None or (isinstance(h, dict) and h.get("state") in ("skipped", "failed")
                     and isinstance(h.get("reason"), str)):
        return None
    if not (isinstance(h, dict) and h.get("state") == "ok" and isinstance(h.get("ranks"), dict)
            and isinstance(h.get("agree"), bool) and _seconds(h.get("tolerance"))
            and isinstance(temporal, dict)):
        return "hta is not HTA's reading (state, ranks, agree, tolerance) beside temporal"
    keys = ("hta_span_s", "hta_idle_s", "hta_compute_s", "hta_non_compute_s")
    for rank, x in h["ranks"].items():
        mine = temporal.get(rank)
        if not (isinstance(x, dict) and all(_seconds(x.get(k)) and x[k] >= 0 for k in keys)
                and isinstance(mine, dict) and all(
                    _seconds(mine.get(k)) and mine[k] >= 0
                    for k in ("span_s", "idle_s", "compute_s", "non_compute_s"))):
            return f"hta.ranks.{rank} is not HTA's seconds beside the terms' (temporal)"
    return None


def read_breakdown(run_dir: str | os.PathLike) -> tuple[dict | None, str]:
    """``(record, "")`` of a sound ``breakdown.json`` with terms; ``(None, reason)`` when
    there is none, it is empty (its own reason) or damaged."""
    try:
        rec = read_object(os.path.join(os.fspath(run_dir), BREAKDOWN_FILE))
    except RecordError as e:
        return None, str(e)
    if rec is None:
        return None, f"no {BREAKDOWN_FILE} (the run was not profiled)"
    why = check_breakdown(rec)
    if why:
        return None, f"{BREAKDOWN_FILE}: {why}"
    if rec["state"] == EMPTY:
        return None, rec["reason"]
    return rec, ""
