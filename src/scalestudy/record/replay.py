"""How much of a profiled step's waiting for other ranks was caused by waiting for a core: the
step replayed across its ranks with every training thread's run-queue wait taken out.

A rank's step is a sequence of pieces on its own timeline (``StepReading``): running (its
operators, scopes and gaps; the wait for a core inside them known from the run-queue
samples, ``timeline.CoreWaits``) and blocked on a transfer (``Transfer.blocked``). The
transfers of one collective (every rank of its group) or of one send and its receive are a
*match*: each member completes as long after the match's last launch as it did in the
trace (the transfer itself; a send as its receive: gloo ends a send's range when its sender
waits for it). A blocked piece that ends as transfers of its rank end lasts until the last
of them completes; any other piece keeps its length.

The replay runs every rank's pieces again with the running ones shortened by their wait for
a core, each match completing at its members' new latest launch plus its transfer, until no
time moves (the waits form chains: a stage that fell behind while its sends were buffered is
waited for later, in the drain). Of each blocked piece, what the replay saves is waiting
caused by a wait for a core (``core_wait_s``); it can be negative: a rank whose own wait for
a core made it late would otherwise have waited for its peers.

The matches are collectives (tensor, data, context parallel and the optimizer's): the same
collective on every rank of its group; and a two-stage pipeline's sends, each with the other
stage's receive of the same how-manieth. With more stages which receive a send fed is not in
a gloo trace (a send's range ends when its sender waits for it): a stage's bubble keeps its
per-step estimate (``trace_terms.split_pipeline``). The traces of one host share its wall
clock (Kineto's ``baseTimeNanoseconds``). Pure: no torch, no files.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from scalestudy.record.timeline import StepReading, Transfer

#: Replay rounds at most (each round settles at least one more link of a chain of waits).
ROUNDS = 200
#: When the replay has settled (s): no completion moved by more than this in a round.
SETTLED_S = 1e-7
#: A blocked piece that ends within this of a transfer's end (s) waited for it to complete.
AT_END_S = 2e-6


@dataclass
class _Piece:
    start: float
    end: float
    step: StepReading
    transfer: Transfer | None = None  # blocked on it (None: running)
    #: blocked until these completed (the transfers that ended as it did; empty: not)
    until: tuple[Transfer, ...] = ()


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
            out.append(_Piece(x, y, step, t, tuple(u for u in step.transfers
                                                   if abs(y - u.end) <= AT_END_S)))
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
    starts = {r: [[t for t in p.step.transfers if p.start <= t.start < p.end]
                  for p in pieces[r]] for r in ranks}  # the transfers launched in each piece
    rank_of, done, last, lag = {}, {}, {}, {}
    for i, members in enumerate(matches):
        last[i] = max(t.start + shift[r] for r, t in members)  # the last launch
        for r, t in members:
            rank_of[id(t)] = r
            done[id(t)] = t.end + shift[r]
            lag[id(t)] = done[id(t)] - last[i]
        if any(t.kind == "pp" for _, t in members):  # (a send ends when its sender waits:
            first = min(lag[id(t)] for _, t in members)  # both have it at the delivery)
            lag.update({id(t): first for _, t in members})
    for _ in range(ROUNDS):
        launched: dict = {}
        saved: dict = {}
        for r in ranks:
            now = pieces[r][0].start + shift[r]
            for p, out, begun in zip(pieces[r], cut[r], starts[r]):
                length = p.end - p.start
                waits = [done[id(u)] for u in p.until if id(u) in done]
                if p.transfer is None:
                    new = length - out
                elif waits:
                    new = max(0.0, max(waits) - now)
                    key = (r, id(p.transfer))
                    saved[key] = saved.get(key, 0.0) + length - new
                else:
                    new = length
                for t in begun:  # (a launch inside the piece: pro rata, or where it ends)
                    launched[(r, id(t))] = now + min(new, (t.start - p.start) * new / length)
                now += new
        moved = 0.0
        for i, members in enumerate(matches):
            at = max(launched.get((r, id(t)), t.start + shift[r]) for r, t in members)
            for r, t in members:  # (each member as long after the last launch as it was)
                new = at + lag[id(t)]
                moved = max(moved, abs(new - done[id(t)]))
                done[id(t)] = new
        if moved <= SETTLED_S:
            break
    return saved
