"""The replay of profiled steps without the waits for a core (``record.replay``) on steps of
known timing: it reproduces the trace with nothing taken out, a peer's wait for a rank that
fell behind for want of a core in the step before is saved in the step after, and a peer's
wait for a rank's recording is the profiler's."""

from __future__ import annotations

import pytest

from scalestudy.record import replay
from scalestudy.record.terms import MEASURED_TERMS
from scalestudy.record.timeline import CoreWaits, StepReading, Transfer

US = 1e-6


def _step(window, transfers, samples=(), events=(), cost=0.0) -> StepReading:
    return StepReading("ProfilerStep#0", window[1] - window[0],
                       dict.fromkeys(MEASURED_TERMS, 0.0), {}, transfers,
                       core=CoreWaits(list(samples)) if samples else None, window=window,
                       event_starts=sorted(events), event_cost_s=cost)


def _two_steps(samples=(), events=(), cost=0.0):
    """Rank 0 reaches the second step's all-reduce 500 µs before rank 1, which ran 300 µs
    longer after the first one (in 600-900 µs: where ``samples`` or ``events`` put its wait
    for a core or its recording)."""
    def ar(i, start, end):
        return Transfer("dp", "gloo:all_reduce", i, start * US, end * US,
                        blocked=[(start * US, end * US)])

    a0, b0 = ar(0, 400, 500), ar(1, 1200, 1800)
    a1, b1 = ar(0, 400, 500), ar(1, 1700, 1800)
    ranks = {0: [_step((0, 1000 * US), [a0]), _step((1000 * US, 2000 * US), [b0])],
             1: [_step((0, 1100 * US), [a1], samples, events, cost),
                 _step((1100 * US, 2000 * US), [b1], samples, events, cost)]}
    return ranks, [[(0, a0), (1, a1)], [(0, b0), (1, b1)]], b0


def test_nothing_taken_out_saves_nothing():
    ranks, matches, _ = _two_steps()
    assert all(v == pytest.approx(0.0, abs=1e-12)
               for v in replay.core_saved(ranks, matches).values())


def test_a_peers_wait_for_a_rank_behind_from_the_step_before_is_saved():
    samples = [(0.0, 0.0, 0.0), (600 * US, 0.0, 0.0), (900 * US, 300 * US, 300 * US),
               (3000 * US, 300 * US, 300 * US)]
    ranks, matches, b0 = _two_steps(samples=samples)
    saved = replay.core_saved(ranks, matches)
    assert saved[(0, id(b0))] == pytest.approx(300 * US)
    assert replay.profiler_saved(ranks, matches)[(0, id(b0))] == pytest.approx(0.0, abs=1e-12)


def test_a_peers_wait_for_a_ranks_recording_is_the_profilers():
    events = [600 * US + k * 2 * US for k in range(150)]  # 150 events, 2 µs each
    ranks, matches, b0 = _two_steps(events=events, cost=2 * US)
    assert replay.core_saved(ranks, matches)[(0, id(b0))] == pytest.approx(0.0, abs=1e-12)
    assert replay.profiler_saved(ranks, matches)[(0, id(b0))] == pytest.approx(300 * US)


def test_a_stage_waiting_for_one_behind_for_want_of_a_core_is_saved():
    """Stage 0 waited 300 µs for a core before it sent at 790 µs; stage 1 had posted its
    receive at 500 µs and got the activations at 800: without the wait it would have had them
    at 510 µs. The two-stage pipeline's k-th send is matched with the other stage's k-th
    receive."""
    from scalestudy.record.trace_terms import _pipeline_matches

    send = Transfer("pp", "gloo:send", 0, 790 * US, 800 * US, blocked=[(790 * US, 800 * US)])
    recv = Transfer("pp", "gloo:recv", 0, 500 * US, 800 * US, blocked=[(500 * US, 800 * US)])
    samples = [(0.0, 0.0, 0.0), (100 * US, 0.0, 0.0), (400 * US, 300 * US, 300 * US),
               (2000 * US, 300 * US, 300 * US)]
    ranks = {0: [_step((0, 900 * US), [send], samples)], 1: [_step((0, 900 * US), [recv])]}
    layout = {"pp": 2, "dp": 1, "tp": 1, "cp": 1}
    matches = _pipeline_matches(ranks, layout, 0)
    assert [[(r, t.op) for r, t in m] for m in matches] == [[(0, "gloo:send"), (1, "gloo:recv")]]
    assert replay.core_saved(ranks, matches)[(1, id(recv))] == pytest.approx(290 * US)
    assert _pipeline_matches(ranks, {**layout, "pp": 1, "dp": 2}, 0) is None
