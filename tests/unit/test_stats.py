import numpy as np
import pytest

from scalestudy.analysis import stats


def test_steady_state_drops_declared_warmup_and_nonfinite():
    assert stats.steady_state([9, 8, 1, 2, float("nan"), 3], warmup_steps=2).tolist() == [1, 2, 3]
    assert stats.steady_state([1, 2], warmup_steps=5).size == 0


def test_steady_state_detects_a_slow_start():
    times = [5.0, 3.0, 1.3, 1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0]
    # declared warm-up 1 misses the slow second step; detection drops 3.0 and 1.3 (>1.15)
    assert stats.steady_state(times, 1, detect=False)[0] == 3.0
    assert stats.steady_state(times, 1, detect=True).tolist() == times[3:]
    # a flat series loses nothing, and detection keeps at least min_keep steps
    assert stats.steady_state([1.0] * 6, 0, detect=True).size == 6
    assert stats.steady_state([9, 9, 9, 1, 1, 1], 0, detect=True, min_keep=3).tolist() == [1, 1, 1]


def test_median_iqr_by_hand():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s["median"] == 3.0 and (s["q25"], s["q75"]) == (2.0, 4.0) and s["iqr"] == 2.0
    assert s["n_steps"] == 5 and s["n_repeats"] == 1
    assert s["ci_lo"] <= 3.0 <= s["ci_hi"]


def test_bootstrap_is_deterministic_and_degenerate_for_constant_data():
    x = np.random.default_rng(3).normal(1.0, 0.1, 40)
    assert stats.bootstrap_median_ci(x) == stats.bootstrap_median_ci(x)
    assert stats.bootstrap_median_ci(x, seed=1) != stats.bootstrap_median_ci(x, seed=2)
    assert stats.bootstrap_median_ci([2.0] * 10) == (2.0, 2.0)
    assert np.isnan(stats.summarize([])["median"])


def test_bootstrap_ci_coverage():
    # 95% CI of the median of N(0,1) samples of 41 should cover 0 about 95% of the time;
    # 200 trials: accept 0.88..0.995 (binomial sd ~1.5% plus bootstrap's small-sample bias).
    rng = np.random.default_rng(0)
    hits = 0
    for i in range(200):
        lo, hi = stats.bootstrap_median_ci(rng.normal(0, 1, 41), n_boot=500, seed=i)
        hits += lo <= 0.0 <= hi
    assert 0.88 <= hits / 200 <= 0.995


def test_hierarchical_bootstrap_widens_with_repeat_to_repeat_spread():
    rng = np.random.default_rng(1)
    reps = [rng.normal(m, 0.01, 30) for m in (1.0, 1.1, 0.9)]
    pooled_lo, pooled_hi = stats.bootstrap_median_ci(np.concatenate(reps))  # ignores repeats
    lo, hi = stats.bootstrap_median_ci(reps)
    assert (hi - lo) > 2 * (pooled_hi - pooled_lo)
    assert lo < 1.0 < hi
    d = stats.bootstrap_medians(reps, n_boot=300)
    assert d.shape == (300,) and np.all((d > 0.85) & (d < 1.15))
    # unequal repeat sizes: a replicate's median is over exactly the steps it drew
    d2 = stats.bootstrap_medians([[1.0], [2.0, 2.0, 2.0]], n_boot=200)
    assert set(np.unique(d2)) <= {1.0, 1.5, 2.0}
    assert stats.summarize(reps)["n_repeats"] == 3


@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 10, 11, 16])
def test_rows_functions_equal_the_one_sample_functions(m):
    # the batched functions aggregation uses give exactly the one-run values, row by row
    rng = np.random.default_rng(m)
    x = rng.lognormal(0.0, 0.05, (6, m))
    x[1] = x[1].round(2)  # ties
    x[2] = 0.5  # constant
    seeds = [int(s) for s in rng.integers(0, 2**32, 6)]
    rows = stats.bootstrap_medians_rows(x, seeds, n_boot=300)
    assert rows.shape == (6, 300)
    med, q25, q75 = stats.median_iqr_rows(x)
    lo, hi = stats.percentile_ci_rows(rows)
    for i in range(6):
        one = stats.bootstrap_medians(x[i], n_boot=300, seed=seeds[i])
        assert np.array_equal(rows[i], one)
        assert (lo[i], hi[i]) == stats.percentile_ci(one)
        assert med[i] == float(np.median(x[i])) and (q25[i], q75[i]) == stats.iqr(x[i])


def test_percentile_ci_rows_equals_percentile_ci_with_nonfinite_rows():
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 2000, 2001):
        d = rng.normal(size=(40, n))
        d[3] = d[3].round(1)
        if n > 2:
            d[4, 1], d[5, 0], d[6] = np.inf, -np.inf, np.nan
        lo, hi = stats.percentile_ci_rows(d)
        for i in range(40):
            assert np.array_equal([lo[i], hi[i]], stats.percentile_ci(d[i]), equal_nan=True)
    lo, hi = stats.percentile_ci_rows(np.empty((3, 0)))
    assert np.isnan(lo).all() and np.isnan(hi).all()


def test_bootstrap_cost_is_bounded_whatever_the_step_count():
    # 200,000 steps: the bootstrap draws from an evenly spaced sub-sample of MAX_BOOT_STEPS
    x = np.random.default_rng(1).lognormal(-3, 0.1, size=200_000)
    idx = stats.boot_index(x.size)
    assert idx.size == stats.MAX_BOOT_STEPS and idx[0] == 0 and idx[-1] == x.size - 1
    rows = stats.bootstrap_medians_rows(x[None, :], [7])
    assert rows.shape == (1, stats.N_BOOT)
    assert np.array_equal(rows[0], stats.bootstrap_medians(x[idx], seed=7))
    assert np.array_equal(stats.bootstrap_medians(x, seed=7), rows[0])
    lo, hi = stats.percentile_ci(rows[0])
    assert lo < np.median(x) < hi  # the full sample's median inside the sub-sample's CI
    # short runs are untouched
    assert stats.boot_index(stats.MAX_BOOT_STEPS) is None


def test_shrunk_mean_by_hand():
    assert stats.shrunk_mean([0.2, 0.2, 0.2]) == pytest.approx(0.2)  # no spread: whole
    # mean 0.2, var 0.02, se² 0.01: 0.2 · (1 - 0.01 / 0.04)
    assert stats.shrunk_mean([0.3, 0.1]) == pytest.approx(0.15)
    assert stats.shrunk_mean([-0.3, -0.1]) == pytest.approx(-0.15)  # symmetric
    assert stats.shrunk_mean([0.4, -0.2]) == 0.0  # mean 0.1 within its se (0.3): noise
    assert stats.shrunk_mean([0.5]) == 0.5  # one value: nothing to judge its noise by
    with pytest.raises(ValueError):
        stats.shrunk_mean([])
