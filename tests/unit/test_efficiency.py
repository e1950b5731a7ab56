"""Efficiency math on hand-made tables with known answers."""

import numpy as np
import pandas as pd
import pytest

from scalestudy.analysis.efficiency import InvariantError, check_invariant, efficiency_table

NS = [1, 2, 4, 8]


def weak_table():
    # 100 tokens per device per step; T grows at 4 and 8 -> E = 1, 1, 0.8, 0.5
    return pd.DataFrame({"n": NS, "tokens_per_step": [100 * n for n in NS],
                         "step_time_s": [1.0, 1.0, 1.25, 2.0]})


def strong_table():
    # 800 tokens per step; X = 800/(T N) = 100, 100, 80, 50 -> E = 1, 1, 0.8, 0.5
    return pd.DataFrame({"n": NS, "tokens_per_step": [800] * 4, "step_time_s": [8.0, 4.0, 2.5, 2.0]})


def test_weak_known_answer():
    e = efficiency_table(weak_table(), "weak")
    assert e["efficiency"].tolist() == pytest.approx([1, 1, 0.8, 0.5])
    assert e["speedup"].tolist() == pytest.approx([1, 1, 0.8, 0.5])  # weak: E = T0/T
    assert e["tokens_per_s_per_device"].tolist() == pytest.approx([100, 100, 80, 50])
    assert (e["baseline_n"] == 1).all()


def test_strong_known_answer():
    e = efficiency_table(strong_table(), "strong")
    assert e["efficiency"].tolist() == pytest.approx([1, 1, 0.8, 0.5])
    assert e["speedup"].tolist() == pytest.approx([1, 2, 3.2, 4])
    assert e["ideal_speedup"].tolist() == pytest.approx([1, 2, 4, 8])
    # E = T0 N0 / (T N)
    assert e["efficiency"].tolist() == pytest.approx([8 * 1 / (t * n) for t, n in zip([8, 4, 2.5, 2], NS)])


def test_named_baseline():
    e = efficiency_table(strong_table(), "strong", baseline_n=2)
    assert e["efficiency"].tolist() == pytest.approx([1, 1, 0.8, 0.5])
    assert e["speedup"].tolist() == pytest.approx([0.5, 1, 1.6, 2])
    assert (e["baseline_n"] == 2).all()


def test_failed_points_keep_their_row_and_move_the_default_baseline():
    d = strong_table().assign(status=["oom", "ok", "ok", "timeout"])
    d.loc[0, "step_time_s"] = np.nan
    e = efficiency_table(d, "strong")
    assert (e["baseline_n"] == 2).all()  # smallest N that ran
    assert e["status"].tolist() == ["oom", "ok", "ok", "timeout"]
    assert np.isnan(e["efficiency"].iloc[0]) and np.isnan(e["efficiency"].iloc[3])
    assert e["efficiency"].iloc[1:3].tolist() == pytest.approx([1.0, 0.8])
    # a named baseline that failed gives no curve, with a note
    e = efficiency_table(d, "strong", baseline_n=1)
    assert e["efficiency"].isna().all() and "oom" in e["note"].iloc[0]


def test_ci_from_bootstrap_ratio():
    # degenerate distributions -> CI equals the point estimate
    boot = {n: np.full(100, t) for n, t in zip(NS, [8.0, 4.0, 2.5, 2.0])}
    e = efficiency_table(strong_table(), "strong", boot=boot)
    assert e["efficiency_ci_lo"].tolist() == pytest.approx(e["efficiency"].tolist())
    assert e["speedup_ci_hi"].tolist() == pytest.approx(e["speedup"].tolist())
    # noisy distributions bracket the estimate; at N0 the efficiency is exactly 1
    rng = np.random.default_rng(0)
    boot = {n: t * rng.normal(1, 0.02, 1000) for n, t in zip(NS, [8.0, 4.0, 2.5, 2.0])}
    e = efficiency_table(strong_table(), "strong", boot=boot)
    assert (e["efficiency_ci_lo"] <= e["efficiency"]).all() and (e["efficiency"] <= e["efficiency_ci_hi"]).all()
    assert e.loc[0, ["efficiency_ci_lo", "efficiency_ci_hi"]].tolist() == [1.0, 1.0]
    width = e["efficiency_ci_hi"] - e["efficiency_ci_lo"]
    assert 0.02 < width.iloc[3] / e["efficiency"].iloc[3] < 0.2  # ~2.8% relative sd -> ~11% wide


def test_invariant_weak_and_strong():
    check_invariant(weak_table(), "weak")
    check_invariant(strong_table(), "strong")
    with pytest.raises(InvariantError, match="tokens per step"):
        check_invariant(weak_table(), "strong")
    bad = weak_table().assign(point_id=["a", "b", "c", "d"])
    bad.loc[2, "tokens_per_step"] = 999
    with pytest.raises(InvariantError, match=r"tokens per device per step should be 100.*c \(249\.75\)"):
        check_invariant(bad, "weak")
    with pytest.raises(InvariantError):
        efficiency_table(bad, "weak")


def test_unknown_mode_names_the_field():
    bad = weak_table().assign(point_id=["a", "b", "c", "d"])
    bad.loc[2, "tokens_per_step"] = 999
    with pytest.raises(ValueError, match="mode='both'"):
        check_invariant(bad, "both")


def test_invariant_checked_per_series():
    two = pd.concat([strong_table().assign(series="s1"),
                     strong_table().assign(series="s2", tokens_per_step=1600)])
    check_invariant(two, "strong")  # each series keeps its own constant
    two.iloc[5, two.columns.get_loc("tokens_per_step")] = 1
    with pytest.raises(InvariantError, match="'s2'") as err:
        check_invariant(two, "strong")
    assert "'s1'" not in str(err.value)
