"""The efficiency lost term by term adds up to 1 − E exactly, weak and strong; a traced step far
from the timed one is said in the row's note; one straggler per point (the trace's reading,
the timed detector's beside it); HTA's shares beside the project's; the sentence names the
terms that took the efficiency."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scalestudy.analysis.loss_by_term import (BREAKDOWN_COLUMNS, LOSS_COLUMNS, hta_columns,
                                              loss_table, predicted_tables, set_against_timed,
                                              straggler_columns, with_residual)
from scalestudy.record.terms import STEP_TERMS
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


def test_no_term_is_scaled_the_timed_steps_difference_is_unattributed():
    traced = _terms(gemm_s=0.012, dp_comm_exposed_s=0.005, sync_wait_s=0.003)
    for timed in (0.024, 0.014):  # longer, and shorter, than the 20 ms traced
        out = with_residual(traced, timed)
        assert all(out[k] == traced[k] for k in MEASURED_TERMS if k != "unattributed_s")
        assert math.isclose(out["unattributed_s"], timed - 0.020)
        assert math.isclose(sum(out[k] for k in MEASURED_TERMS), timed)


def test_a_traced_step_far_from_the_timed_one_is_said_in_the_note():
    ratio, note = set_against_timed({"step_s": 0.020}, 0.021)
    assert math.isclose(ratio, 0.020 / 0.021) and note == ""
    ratio, note = set_against_timed({"step_s": 0.020}, 0.010)
    assert ratio == 2.0 and "2.00x the timed one" in note


def test_one_straggler_the_traces_reading_first_the_timed_flag_beside_it():
    runs = pd.DataFrame({"straggler": [True], "straggler_rank": [1]})
    quiet = pd.DataFrame({"straggler": [False], "straggler_rank": [3]})
    trace = {"rank": 2, "delay_s": 0.01, "slowed_term": "gemm_s", "peers_wait_s": 0.01}
    both = straggler_columns(trace, runs)
    assert (both["straggler_rank"], both["straggler_by"], both["timed_straggler_rank"],
            both["slowed_term"]) == (2, "trace", 1, "gemm_s")
    timed = straggler_columns(None, runs)
    assert (timed["straggler_rank"], timed["straggler_by"]) == (1, "timed steps")
    # the timed detector names a rank for every run; one it did not flag names none here
    none = straggler_columns(None, quiet)
    assert none["straggler_rank"] is None and none["timed_straggler_rank"] is None


def test_htas_shares_stand_beside_the_projects_and_a_disagreement_is_noted():
    own = {"0": {"span_s": 1.0, "idle_s": 0.1, "compute_s": 0.6, "non_compute_s": 0.3}}
    hta = {"state": "ok", "agree": False, "tolerance": 0.05, "ranks": {"0": {
        "hta_span_s": 1.0, "hta_idle_s": 0.1, "hta_compute_s": 0.5, "hta_non_compute_s": 0.4}}}
    text, note = hta_columns({"hta": hta, "temporal": own})
    assert text == "r0 compute 0.50/0.60 comm 0.40/0.30 idle 0.10/0.10"
    assert note.startswith("HTA disagrees") and "0.10" in note
    assert hta_columns({"hta": {**hta, "agree": True}, "temporal": own})[1] == ""
    assert hta_columns({}) == ("", "")


def test_the_loss_table_and_sentence_name_where_the_efficiency_went():
    eff = pd.DataFrame({"series": ["s", "s"], "mode": ["weak", "weak"], "n": [1, 2],
                        "baseline_n": [1, 1], "efficiency": [1.0, 0.5]})
    m0 = _terms(gemm_s=1.0)
    m = _terms(gemm_s=1.0, sync_wait_s=0.6, dp_comm_exposed_s=0.3, overhead_s=0.1)
    loss = loss_table(eff, {("s", 1): m0, ("s", 2): m})
    at = loss[loss["n"] == 2].set_index("term")
    assert math.isclose(at["measured_loss"].sum(), 0.5)
    assert list(loss.columns) == LOSS_COLUMNS and "predicted_loss" not in loss
    (s,) = loss_sentences(loss)
    assert s["text"].startswith("s at N=2 (vs N₀=1): 0.50 of the efficiency lost: 0.30 "
                                "waiting for the slowest rank, 0.15 DP")
    assert "the model" not in s["text"]  # measured only without the model's side
    # the model's side, from the prediction job's rows (study_predictions.csv), by the same
    # loss arithmetic: the DP traffic doubles the step at N=2 -> 0.50 lost, all of it DP
    pred = pd.DataFrame([{"series": "s", "mode": "weak", "n": n, "baseline_n": 1,
                          "dp_comm_s": dp * 1.5, **{k: 0.0 for k in STEP_TERMS},
                          "gemm_s": 1.0, "dp_comm_exposed_s": dp} for n, dp in ((1, 0.0),
                                                                                (2, 1.0))])
    brk_p, loss_p = predicted_tables(pred)
    two = brk_p[(brk_p["n"] == 2)].set_index("term")
    assert math.isclose(two.loc["dp_comm_exposed_s", "predicted_share"], 0.5)
    assert math.isclose(two.loc["dp_comm_overlapped_s", "predicted_s"], 0.5)
    assert two.loc["data_s", "predicted_s"] == 0.0 and two["predicted_step_s"].eq(2.0).all()
    lp = loss_p[loss_p["n"] == 2].set_index("term")
    assert math.isclose(lp["predicted_loss"].sum(), 0.5)
    assert math.isclose(lp["predicted_loss"]["dp_comm_exposed_s"], 0.5)
    assert math.isclose(lp["predicted_efficiency"].iloc[0], 0.5)
    (s,) = loss_sentences(loss, loss_p)
    assert "the model: 0.50 lost, 0.50 of it DP" in s["text"]
    assert not {"predicted_s", "predicted_share", "predicted_step_s"} & set(BREAKDOWN_COLUMNS)
