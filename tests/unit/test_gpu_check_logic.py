"""The GPU check's logic that needs no GPU: the schedule and the parts' shapes, and how the
trainer picks a backend and a device when several ranks share one GPU."""

from __future__ import annotations

import pytest

from benchmarks import gpu_check
from scalestudy.train.device import BACKEND_ENV, device_index, process_group_backend


def test_the_gpu_schedule_fits_its_budget_and_a_larger_one_is_refused():
    assert sum(s for _, s in gpu_check.schedule(False)) <= gpu_check.BUDGET_S
    with pytest.raises(ValueError, match="more than 100"):
        gpu_check.schedule(False, budget=100)


def test_a_part_of_another_shape_is_named():
    rec = gpu_check.blank("memory", True, "ok", "", "t", 1.0)
    assert gpu_check.shape_problem(rec) is None
    del rec["capacity"]
    assert gpu_check.shape_problem(rec) == "memory: missing capacity"
    assert "state" in gpu_check.shape_problem({**gpu_check.blank("energy", 1, "ok", "", "", 0),
                                               "state": "fine"})


def test_ranks_sharing_a_gpu_wrap_onto_it_and_gloo_can_be_asked_for():
    assert [device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [device_index(r, 2) for r in range(4)] == [0, 1, 0, 1]
    assert process_group_backend("cpu", {}) == "gloo"
    assert process_group_backend("cuda", {BACKEND_ENV: "gloo"}) == "gloo"
    with pytest.raises(ValueError, match="use one of gloo, nccl"):
        process_group_backend("cuda", {BACKEND_ENV: "mpi"})
