"""How much of a profiled step's waiting for other ranks was caused by waiting for a core: the
step replayed across its ranks with every training thread's run-queue wait taken out.

A rank's step is a sequence of pieces on its own timeline (``StepReading``): running (its
operators, scopes and gaps; the wait for a core inside them known from the run-queue
samples, ``timeline.CoreWaits``) and blocked on a transfer (``Transfer.blocked``). The
transfers of one collective (every rank of its group) or of one send and its receive are a
*match*: each member completes as long after the match's last launch as it did in the
trace (the transfer itself). A blocked piece that ends when its
transfer completes lasts until the match completes; any other piece keeps its length.

The replay runs every rank's pieces again with the running ones shortened by their wait for
a core, each match completing at its members' new latest launch plus its transfer, until no
time moves (the waits form chains: a stage that fell behind while its sends were buffered is
waited for later, in the drain). Of each blocked piece, what the replay saves is waiting
caused by a wait for a core (``core_wait_s``); it can be negative: a rank whose own wait for
a core made it late would otherwise have waited for its peers.

The matches are collectives (tensor, data, context parallel and the optimizer's): the same
collective on every rank of its group. A pipeline's sends and receives are not matched: gloo
ends a send's range when its sender waits for it, not when its receiver has it, so which
receive a send fed is not in the trace; a stage's bubble keeps its per-step estimate
(``trace_terms.split_pipeline``). The traces of one host share its wall clock (Kineto's
``baseTimeNanoseconds``). Pure: no torch, no files.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from scalestudy.record.timeline import StepReading, Transfer

#: Replay rounds at most (each round settles at least one more link of a chain of waits).
ROUNDS = 200
#: When the replay has settled (s): no completion moved by more than this in a round.
SETTLED_S = 1e-7
#: A blocked piece that ends within this of its transfer's end (s) waited for it to complete.
AT_END_S = 2e-6


@dataclass
class _Piece:
    start: float
    end: float
    step: StepReading
    transfer: Transfer | None = None  # blocked on it (None: running)
    bound: bool = False  # blocked until the transfer completed


def _pieces(steps: list[StepReading]) -> list[_Piece]:
    """A rank's profiled steps as pieces in time order (trace clock): blocked ones from their
    transfers, the running ones in between (and between the steps)."""
    out, cursor = [], steps[0].window[0]
    for step in steps:
        blocked = sorted(((x, y, t) for t in step.transfers for x, y in t.blocked),
                         key=lambda p: p[0])
        for x, y, t in blocked:
            if x > cursor:
                out.append(_Piece(cursor, x, step))
            out.append(_Piece(x, y, step, t, abs(y - t.end) <= AT_END_S))
            cursor = max(cursor, y)
        if step.window[1] > cursor:
            out.append(_Piece(cursor, step.window[1], step))
            cursor = step.window[1]
    return out


Matches = list[list[tuple[int, Transfer]]]


def core_saved(ranks: dict[int, list[StepReading]], matches: Matches
               ) -> dict[tuple[int, int], float]:
    """Per ``(rank, id(transfer))``, the seconds of the rank's blocking on that transfer that
    the replay without any wait for a core saves (module doc), less what the replay with
    them saves (the replay's own error, tenths of a ms on real traces); ``ranks``: each
    rank's profiled steps, in order; ``matches``: the transfers that complete together."""
    free, same = _replay(ranks, matches, True), _replay(ranks, matches, False)
    return {k: v - same.get(k, 0.0) for k, v in free.items()}


def profiler_saved(ranks: dict[int, list[StepReading]], matches: Matches
                   ) -> dict[tuple[int, int], float]:
    """As :func:`core_saved`, what taking the profiler's cost per recorded event out of the
    running pieces too saves beyond taking out the waits for a core alone: a peer's waiting
    for a rank slowed by its own recording, which the profiler, not the step, cost."""
    both, core = _replay(ranks, matches, True, True), _replay(ranks, matches, True)
    return {k: v - core.get(k, 0.0) for k, v in both.items()}


def _removed(p: _Piece, without_core: bool, without_profiler: bool) -> float:
    """What the replay takes out of a running piece (s): its wait for a core, the
    profiler's cost of the events that start in it."""
    step = p.step
    out = step.core.between(p.start, p.end) if without_core and step.core else 0.0
    if without_profiler:
        n = bisect_left(step.event_starts, p.end) - bisect_left(step.event_starts, p.start)
        out += n * step.event_cost_s
    return min(p.end - p.start, out)


def _replay(ranks: dict[int, list[StepReading]], matches: Matches, without_core: bool,
            without_profiler: bool = False) -> dict[tuple[int, int], float]:
    """What :func:`core_saved` replays, with the waits for a core and the profiler's cost
    taken out of the running pieces, or not."""
    ref = min(v[0].clock_ns for v in ranks.values())
    shift = {r: (v[0].clock_ns - ref) * 1e-9 for r, v in ranks.items()}  # a common clock
    pieces = {r: _pieces(v) for r, v in ranks.items()}
    cut = {r: [_removed(p, without_core, without_profiler) if p.transfer is None else 0.0
               for p in pieces[r]] for r in ranks}
    match_of, done, last = set(), {}, {}
    for i, members in enumerate(matches):
        last[i] = max(t.start + shift[r] for r, t in members)  # the last launch
        for r, t in members:
            match_of.add((r, id(t)))
            done[(r, id(t))] = t.end + shift[r]
    saved: dict = {}
    for _ in range(ROUNDS):
        launched: dict = {}
        for r in ranks:
            now = pieces[r][0].start + shift[r]
            for p, out in zip(pieces[r], cut[r]):
                length = p.end - p.start
                if p.transfer is None:
                    for t in p.step.transfers:  # (a launch inside the piece: pro rata)
                        if p.start <= t.start < p.end:
                            f = (t.start - p.start) / length
                            launched[(r, id(t))] = now + f * (length - out)
                    now += length - out
                    continue
                key = (r, id(p.transfer))
                launched.setdefault(key, now)
                if p.bound and key in match_of:
                    new = max(0.0, done[key] - now)
                    saved[key] = length - new
                    now += new
                else:
                    now += length
        moved = 0.0
        for i, members in enumerate(matches):
            at = max(launched.get((r, id(t)), t.start + shift[r]) for r, t in members)
            for r, t in members:  # (each member as long after the last launch as it was)
                new = at + (t.end + shift[r] - last[i])
                moved = max(moved, abs(new - done[(r, id(t))]))
                done[(r, id(t))] = new
        if moved <= SETTLED_S:
            break
    return saved
