"""The efficiency lost term by term adds up to 1 − E exactly, weak and strong; traced terms set
against the timed step keep the waits and scale the work; the sentence names the terms that
took the efficiency."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scalestudy.analysis.breakdown import dilation_factor, loss_table, scaled
from scalestudy.analysis.efficiency import efficiency_loss
from scalestudy.record.terms import MEASURED_TERMS
from scalestudy.report.breakdown import loss_sentences


def _terms(**kw) -> dict:
    return {k: kw.get(k, 0.0) for k in MEASURED_TERMS}


@pytest.mark.parametrize("mode", ["weak", "strong"])
def test_losses_add_up_to_one_minus_efficiency(mode):
    t0 = _terms(gemm_s=0.8, overhead_s=0.2)
    t = _terms(gemm_s=0.8 if mode == "weak" else 0.2, overhead_s=0.2, dp_comm_exposed_s=0.3,
               sync_wait_s=0.1)
    n0, n = 1, 4
    loss = efficiency_loss(mode, t, t0, n, n0)
    T, T0 = sum(t.values()), sum(t0.values())
    e = T0 / T if mode == "weak" else T0 * n0 / (T * n)
    assert math.isclose(sum(loss.values()), 1 - e, abs_tol=1e-12)
    assert math.isclose(loss["dp_comm_exposed_s"], 0.3 / T)
    if mode == "strong":  # the GEMMs shrank exactly as N grew: nothing lost to them
        assert math.isclose(loss["gemm_s"], 0.0, abs_tol=1e-12)
        assert math.isclose(loss["overhead_s"], (0.2 - 0.2 / 4) / T)


def test_traced_waits_keep_their_seconds_and_the_work_is_scaled_to_the_timed_step():
    rec = {"step_s": 0.020, "terms": _terms(gemm_s=0.012, dp_comm_exposed_s=0.005,
                                            sync_wait_s=0.003)}
    f, kept, note = dilation_factor(rec, 0.014)  # the profiler doubled the 6 ms of work
    out = scaled(rec["terms"], f, kept)
    assert kept and not note and math.isclose(1 / f, 2.0)
    assert math.isclose(out["gemm_s"], 0.006) and out["dp_comm_exposed_s"] == 0.005
    assert math.isclose(sum(out.values()), 0.014)
    f, kept, note = dilation_factor(rec, 0.007)  # the traced waits exceed the timed step
    assert not kept and "exceed" in note
    assert math.isclose(sum(scaled(rec["terms"], f, kept).values()), 0.007)


def test_the_loss_table_and_sentence_name_where_the_efficiency_went():
    eff = pd.DataFrame({"series": ["s", "s"], "mode": ["weak", "weak"], "n": [1, 2],
                        "baseline_n": [1, 1], "efficiency": [1.0, 0.5]})
    m0 = _terms(gemm_s=1.0)
    m = _terms(gemm_s=1.0, sync_wait_s=0.6, dp_comm_exposed_s=0.3, overhead_s=0.1)
    loss = loss_table(eff, {("s", 1): (m0, m0), ("s", 2): (m, _terms(gemm_s=1.0,
                                                                      dp_comm_exposed_s=1.0))})
    at = loss[loss["n"] == 2].set_index("term")
    assert math.isclose(at["measured_loss"].sum(), 0.5)
    assert math.isclose(at["predicted_loss"].sum(), 0.5)
    (s,) = loss_sentences(loss)
    assert s["text"].startswith("s at N=2 (vs N₀=1): 0.50 of the efficiency lost: 0.30 "
                                "waiting for the slowest rank, 0.15 DP")
    assert "the model: 0.50 lost, 0.50 of it DP" in s["text"]
