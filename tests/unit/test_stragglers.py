"""Stragglers (``scalestudy.record.stragglers``): the ranks' spread of step times, the flag and
its threshold, the record's check, the runner's retry decision and the ``slow`` fault."""

from __future__ import annotations

import dataclasses
import json
import subprocess

import pytest

import fault_injection
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.checks import PointError
from scalestudy.config.identity import identify
from scalestudy.record import stragglers
from scalestudy.record.terms import MEASURED_TERMS
from scalestudy.record.run_records import check_summary, read_summary
from scalestudy.record.bounded_read import RecordError
from scalestudy.run import health

HOSTS = ["node-a", "node-a", "node-b", "node-b"]


def test_a_late_rank_is_the_one_with_the_shortest_step():
    # rank 2 reaches every step 30 ms late: its peers wait for it inside their steps
    per_rank = [[0.5, 0.04, 0.04, 0.04], [0.5, 0.04, 0.04, 0.04],
                [0.5, 0.01, 0.01, 0.01], [0.5, 0.04, 0.04, 0.04]]
    rec = stragglers.rank_spread(per_rank, HOSTS, warmup_steps=1)
    assert rec == {"rank_spread": pytest.approx(4.0), "straggler_rank": 2,
                   "straggler_share": 1.0, "straggler_host": "node-b", "steps": 3}
    # slowest / median would read 1.0 here: 3 of 4 ranks waited
    assert stragglers.record_problem(rec) is None


def test_spread_is_the_median_over_steady_steps_and_ties_go_to_the_lower_rank():
    per_rank = [[9.0, 1.1, 1.0, 3.0], [1.0, 1.0, 2.0, 1.0]]
    rec = stragglers.rank_spread(per_rank, ["h0", "h1"], warmup_steps=1)
    # steady ratios 1.1, 2.0, 3.0 -> median 2.0; fastest: rank 1, 0, 1 -> rank 1 (2 of 3)
    assert rec["rank_spread"] == pytest.approx(2.0)
    assert (rec["straggler_rank"], rec["straggler_host"]) == (1, "h1")
    assert rec["straggler_share"] == pytest.approx(2 / 3)
    tie = stragglers.rank_spread([[1.0, 2.0], [2.0, 1.0]], ["h0", "h1"])
    assert tie["straggler_rank"] == 0


def test_no_record_without_two_ranks_or_steady_steps():
    assert stragglers.rank_spread([[0.1, 0.1]], ["h"]) is None
    assert stragglers.rank_spread([[0.1], [0.1]], ["h", "h"], warmup_steps=1) is None
    assert stragglers.columns(None, 1.2) == dict.fromkeys(stragglers.RUNS_COLUMNS)


def test_flag_threshold_note_and_columns():
    rec = {"rank_spread": 1.5, "straggler_rank": 1, "straggler_share": 0.75,
           "straggler_host": "node-b", "steps": 8}
    assert stragglers.flagged(rec, 1.2) and not stragglers.flagged(rec, 1.5)
    assert not stragglers.flagged(None, 1.0)
    # a late rank that changes from step to step (more processes than cores) is no straggler
    assert not stragglers.flagged(dict(rec, straggler_share=0.38), 1.2)
    assert stragglers.flagged(dict(rec, straggler_share=stragglers.MIN_SHARE), 1.2)
    note = stragglers.note(rec, 1.2)
    assert note.startswith("straggler: rank 1 on node-b held the others up in 75% of 8 steady")
    assert "1.50 (median) > platform.straggler_ratio 1.2" in note
    cols = stragglers.columns(rec, 1.2)
    assert cols == {"rank_spread": 1.5, "straggler_rank": 1, "straggler_host": "node-b",
                    "straggler": True, "straggler_note": note}
    assert stragglers.columns(rec, 2.0)["straggler_note"] == ""
    assert stragglers.threshold({"platform": {"straggler_ratio": 1.7}}) == 1.7
    assert stragglers.threshold({"platform": {}}) == stragglers.STRAGGLER_RATIO  # older point


@pytest.mark.parametrize("bad, why", [
    ([], "is not an object"),
    ({"rank_spread": 0.5}, "rank_spread 0.5 is not a number >= 1"),
    ({"rank_spread": 1.1, "straggler_rank": True}, "straggler_rank True is not an integer"),
    ({"rank_spread": 1.1, "straggler_rank": 0, "straggler_share": 0,
      "straggler_host": "h", "steps": 1}, "straggler_share 0 is not a fraction"),
    ({"rank_spread": 1.1, "straggler_rank": 0, "straggler_share": 1}, "straggler_host missing"),
])
def test_the_reader_refuses_a_damaged_record(bad, why):
    with pytest.raises(RecordError, match="summary.json: stragglers." + why.replace("(", r"\(")):
        check_summary({"stragglers": bad})


def test_the_threshold_is_a_checked_setting_outside_the_point_id():
    base = identify(Point.for_layout(Model(), device="cpu", dp=2))
    other = identify(base.replace(platform=dataclasses.replace(base.platform, straggler_ratio=3.0)))
    assert other.platform.straggler_ratio == 3.0 and base.platform.straggler_ratio == 1.2
    assert other.point_id == base.point_id and other.config_hash == base.config_hash
    with pytest.raises(PointError, match="platform.straggler_ratio: 0.9 is not allowed"):
        dataclasses.replace(base.platform, straggler_ratio=0.9)


def test_the_runner_retries_an_ok_attempt_only_when_it_is_flagged(tmp_path):
    point = identify(Point.for_layout(Model(), device="cpu", dp=2))
    rec = {"rank_spread": 1.9, "straggler_rank": 1, "straggler_share": 1.0,
           "straggler_host": "node-b", "steps": 4}
    (tmp_path / "summary.json").write_text(json.dumps({"stragglers": rec}))
    entry = health.attempt_stragglers(point, tmp_path, "ok")
    assert entry["rank_spread"] == 1.9 and entry["straggler"].startswith("straggler: rank 1")
    assert health.retry_straggler(entry)
    assert health.attempt_stragglers(point, tmp_path, "crashed") == {}
    calm = point.replace(platform=dataclasses.replace(point.platform, straggler_ratio=2.0))
    assert health.attempt_stragglers(calm, tmp_path, "ok") == {"rank_spread": 1.9}
    assert not health.retry_straggler({"rank_spread": 1.9})
    (tmp_path / "summary.json").write_text("{}")  # one rank, a command: nothing to judge
    assert health.attempt_stragglers(point, tmp_path, "ok") == {}
    assert read_summary(tmp_path)[1] is None


def test_the_slow_fault_sleeps_before_every_step_from_its_step(monkeypatch):
    [fault] = fault_injection.parse_faults("slow:rank=1:ms=40:step=2:match=weak_")
    assert fault == {"kind": "slow", "rank": 1, "step": 2, "match": "weak_", "ms": 40}
    slept = []
    monkeypatch.setattr(fault_injection.time, "sleep", slept.append)
    for step in range(4):
        fault_injection.inject_fault(fault, step)
    assert slept == [0.04, 0.04]
    with pytest.raises(ValueError, match="bad option 'ms=5'"):
        fault_injection.parse_faults("kill:ms=5")  # only a slow fault has a delay


# --- the node check of a multi-node Slurm point (scalestudy.run.health) ----------------------

def _two_node_point(**platform):
    return identify(Point.for_layout(Model(), device="cpu", dp=4, devices_per_node=2,
                                     **platform))


def test_a_node_far_below_the_median_is_slow_and_excluded_only_with_a_spare():
    rows = [{"node": "n1", "flops_per_s": 1e11}, {"node": "n2", "flops_per_s": 0.9e11},
            {"node": "n3", "flops_per_s": 0.3e11}]
    assert health.slow_nodes(rows, 1.2) == ["n3"]
    assert health.slow_nodes(rows, 5.0) == [] and health.slow_nodes(rows[:1], 1.2) == []
    assert health.exclusion(rows, ["n3"], needed=2) == (
        ["n3"], "excluded n3 (slow in the node check)")
    kept, why = health.exclusion(rows, ["n3"], needed=3)
    assert kept == [] and why.startswith("n3 slow in the node check but not excluded")
    assert health.parse_rows('noise\n{"node": "n1", "flops_per_s": 5}\n{"node": "n2"}\n[1]\n') \
        == [{"node": "n1", "flops_per_s": 5.0}]


def test_the_check_runs_on_slurm_only_and_its_exclusion_reaches_srun(tmp_path):
    from scalestudy.run import launch

    point = _two_node_point()
    assert point.nodes == 2
    slurm = {"SLURM_JOB_ID": "42"}
    calls = []

    def fake_srun(argv, **kw):
        calls.append(argv)
        out = "".join(json.dumps({"node": n, "flops_per_s": r}) + "\n"
                      for n, r in (("n1", 1e11), ("n2", 1e11), ("n3", 1e10)))
        return subprocess.CompletedProcess(argv, 0, out, "")

    entry = health.before_attempt(point, tmp_path, slurm, run=fake_srun)
    assert calls[0][:3] == ["srun", "--ntasks-per-node", "1"]
    assert calls[0][-3:] == ["-m", "scalestudy", "nodecheck"]
    assert entry["node_check"]["slow"] == ["n3"] and entry["node_check"]["exclude"] == ["n3"]
    assert json.loads((tmp_path / "health.json").read_text()) == entry["node_check"]
    argv = launch.launch_argv(point, tmp_path, environ=slurm)
    assert argv[0] == "srun" and "--exclude=n3" in argv
    # off Slurm: no check, and no stale exclusion left behind
    assert health.before_attempt(point, tmp_path, {}, run=fake_srun) == {}
    assert len(calls) == 1 and not (tmp_path / "health.json").exists()
    assert "--exclude=n3" not in launch.launch_argv(point, tmp_path, environ=slurm)


def test_a_failed_check_excludes_nothing_and_says_why(tmp_path):
    def broken(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "srun: error: Unable to create step")
    rec = health.check_nodes(_two_node_point(), tmp_path, run=broken)
    assert rec["exclude"] == [] and rec["error"].startswith("node check exit code 1: srun")


def _rank(gemm: float, wait: float, **terms) -> dict:
    t = {k: 0.0 for k in MEASURED_TERMS}
    t.update(gemm_s=gemm, sync_wait_s=wait, overhead_s=0.002, **terms)
    return {"terms": t, "step_s": sum(t.values())}


def test_the_trace_names_a_rank_slowed_inside_its_step_and_the_term_that_grew():
    # rank 2's GEMMs took 8 ms more; the others waited for it
    per_rank = {0: _rank(0.010, 0.008), 1: _rank(0.010, 0.0079), 2: _rank(0.018, 0.0),
                3: _rank(0.0101, 0.0081)}
    rec = stragglers.trace_straggler(per_rank, lambda r: (), 1.2)
    assert rec["rank"] == 2 and rec["slowed_term"] == "gemm_s"
    assert rec["delay_s"] == pytest.approx(0.008, abs=2e-4)
    assert rec["peers_wait_s"] == pytest.approx(0.008, abs=2e-4)
    # with pipeline stages only the ranks of one stage compare (their work is alike)
    assert stragglers.trace_straggler(per_rank, lambda r: r, 1.2) is None
    # a rank whose work grew but that held nobody up (its peers did not wait) is none
    alone = {0: _rank(0.010, 0.001), 1: _rank(0.018, 0.0), 2: _rank(0.010, 0.001)}
    assert stragglers.trace_straggler(alone, lambda r: (), 1.2) is None


def test_the_trace_names_a_late_rank_only_when_it_is_late_in_every_step():
    # rank 1 reached the step late (a sleep outside its traced step): its work did not grow
    per_rank = {0: _rank(0.010, 0.030), 1: _rank(0.010, 0.0)}
    assert stragglers.trace_straggler(per_rank, lambda r: (), 1.2, {0: 0.5, 1: 0.5}) is None
    rec = stragglers.trace_straggler(per_rank, lambda r: (), 1.2, {0: 0.0, 1: 1.0})
    assert rec["rank"] == 1 and rec["slowed_term"] is None and rec["delay_s"] == 0
    # its work a few ms longer by chance: not what its peers waited 30 ms for
    noisy_late = {0: _rank(0.010, 0.030), 1: _rank(0.0125, 0.0)}
    rec = stragglers.trace_straggler(noisy_late, lambda r: (), 1.2, {0: 0.0, 1: 1.0})
    assert rec["rank"] == 1 and rec["slowed_term"] is None
    # the scheduler's noise (work alike, waits small and shifting): no straggler
    noisy = {0: _rank(0.010, 0.001), 1: _rank(0.0105, 0.0), 2: _rank(0.0098, 0.0012)}
    assert stragglers.trace_straggler(noisy, lambda r: (), 1.2, {0: 0.3, 1: 0.4, 2: 0.3}) is None
