"""Steady-state window, medians, IQR and bootstrap confidence intervals of step times.

Pure numpy. Times are seconds; every bootstrap uses a fixed seed so a table is reproducible.
Repeats of a point are separate jobs: their uncertainty enters through a *hierarchical*
bootstrap (resample repeats, then steps within each drawn repeat, then take the median).

The ``*_rows`` functions do the same for many samples at once (one per row) and return exactly
what the one-sample functions return for each row: aggregation of a 10,000-point study calls
them once per step count instead of once per run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
ALPHA = 0.05
#: At most this many steps of one sample enter a bootstrap: a longer run is bootstrapped over
#: an evenly spaced sub-sample of this size (every k-th steady step, in step order), so the
#: cost is bounded (memory ``N_BOOT`` x 2048 floats, 33 MB, per repeat) whatever
#: ``train.steps`` is. The CI is then that of 2048 steps: wider (conservative) than the full
#: sample's; medians and IQRs always use every step.
MAX_BOOT_STEPS = 2048


def boot_index(m: int, cap: int = MAX_BOOT_STEPS) -> np.ndarray | None:
    """Indices of the evenly spaced sub-sample of ``m`` steps a bootstrap uses (None: all)."""
    if m <= cap:
        return None
    return np.unique(np.linspace(0, m - 1, cap).round().astype(np.intp))


def boot_sample(x: np.ndarray) -> np.ndarray:
    """``x`` (last axis: steps) cut to the bootstrap's sub-sample (:func:`boot_index`)."""
    idx = boot_index(x.shape[-1])
    return x if idx is None else x[..., idx]


def steady_state(times: Sequence[float], warmup_steps: int = 0, detect: bool = False,
                 k: float = 3.0, min_keep: int = 3) -> np.ndarray:
    """Steady-state step times: drop the first ``warmup_steps``; with ``detect`` also drop
    further *leading* steps slower than ``median + k·max(1.4826·MAD, 5%·median)`` of the last
    half (a slow start the declared warm-up missed), keeping at least ``min_keep`` steps.
    Non-finite values are dropped."""
    x = np.asarray(times, dtype=float)[max(int(warmup_steps), 0):]
    x = x[np.isfinite(x)]
    if detect and x.size > min_keep:
        tail = x[x.size // 2:]
        med = np.median(tail)
        mad = 1.4826 * np.median(np.abs(tail - med))
        limit = med + k * max(mad, 0.05 * med)
        start = 0
        while start < x.size - min_keep and x[start] > limit:
            start += 1
        x = x[start:]
    return x


def iqr(x: Sequence[float]) -> tuple[float, float]:
    """``(q25, q75)``; NaNs for an empty sample."""
    x = np.asarray(x, dtype=float)
    if x.size == 0:
        return float("nan"), float("nan")
    q25, q75 = np.percentile(x, [25, 75])
    return float(q25), float(q75)


def _as_groups(groups) -> list[np.ndarray]:
    if isinstance(groups, np.ndarray) and groups.ndim == 1:
        groups = [groups]
    elif len(groups) and np.ndim(groups[0]) == 0:  # a flat list of numbers = one repeat
        groups = [groups]
    return [np.asarray(g, dtype=float) for g in groups if len(g)]


def bootstrap_medians(groups, n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """Bootstrap distribution (``n_boot`` values) of the median step time.

    ``groups`` is one sample or a list of samples (one per repeat). With several repeats the
    bootstrap is hierarchical: draw repeats with replacement, then steps with replacement
    within each drawn repeat, and take the median of the pooled draw. Empty → empty array."""
    gs = [boot_sample(g) for g in _as_groups(groups)]
    if not gs:
        return np.empty(0)
    rng = np.random.default_rng(seed)
    if len(gs) == 1:
        g = gs[0]
        return np.median(g[rng.integers(0, g.size, size=(n_boot, g.size))], axis=1)
    r = len(gs)
    picks = rng.integers(0, r, size=(n_boot, r))
    sizes = np.array([g.size for g in gs])
    total = sizes[picks].sum(axis=1)
    buf = np.full((n_boot, int(total.max())), np.inf)  # +inf padding sorts to the end
    fill = np.zeros(n_boot, dtype=int)
    for j in range(r):  # the j-th drawn repeat of every replicate
        for i, g in enumerate(gs):
            rows = np.nonzero(picks[:, j] == i)[0]
            if rows.size == 0:
                continue
            draw = g[rng.integers(0, g.size, size=(rows.size, g.size))]
            buf[rows[:, None], fill[rows, None] + np.arange(g.size)] = draw
            fill[rows] += g.size
    buf.sort(axis=1)
    idx = np.arange(n_boot)
    return 0.5 * (buf[idx, (total - 1) // 2] + buf[idx, total // 2])


def bootstrap_medians_rows(samples, seeds, n_boot: int = N_BOOT) -> np.ndarray:
    """Bootstrap distributions of the median of ``k`` samples of equal size ``m`` (s): a
    ``(k, n_boot)`` array whose row ``i`` is exactly ``bootstrap_medians(samples[i], n_boot,
    seeds[i])`` (same generator and draws per row, same medians).

    ``samples``: ``(k, m)`` finite step times, one sample per row; ``seeds``: ``k`` seeds.
    Only the draws are made per row; for ``m <= 10`` the medians are read off the ranks of the
    drawn steps (their counts packed into one integer per replicate) instead of sorting."""
    x = np.asarray(samples, dtype=float)
    if x.ndim != 2 or len(seeds) != x.shape[0]:
        raise ValueError(f"samples must be (k, m) with k seeds; got {x.shape} and {len(seeds)} seeds")
    x = boot_sample(x)
    k, m = x.shape
    out = np.empty((k, n_boot if m else 0))
    if m == 0 or k == 0:
        return out
    order = np.argsort(x, axis=1, kind="stable")
    srt = np.take_along_axis(x, order, axis=1)
    lo_k, hi_k = (m - 1) // 2, m // 2  # order statistics averaged by np.median
    if m > _PACK_MAX or not hasattr(np, "bitwise_count"):  # (numpy < 2: no popcount)
        for i in range(k):
            idx = np.random.default_rng(seeds[i]).integers(0, x[i].size, size=(n_boot, m))
            out[i] = np.median(x[i][idx], axis=1)
        return out
    # A replicate draws m step indices; count the drawn ranks in 5-bit lanes (lane r = how many
    # draws have rank r, <= m <= 10: 4 bits), summed by a matmul, exact in float64 (< 2**50).
    # Multiplying by 0b00001...00001 turns the counts into prefix counts c_r (draws of rank <= r);
    # the j-th smallest drawn rank is #{r : c_r <= j}, found by adding 15 - j to every lane and
    # counting the lanes whose bit 4 is set (c_r > j).
    rank = np.empty((k, m), dtype=np.intp)
    np.put_along_axis(rank, order, np.arange(m), axis=1)
    weight = np.ldexp(1.0, _LANE * rank)  # 2**(5·rank), exact
    lanes = np.arange(m, dtype=np.uint64) * np.uint64(_LANE)
    ones = np.uint64(1) << lanes
    prefix = np.bitwise_or.reduce(ones)
    high = np.bitwise_or.reduce(np.uint64(16) << lanes)

    def order_stat(cum: np.ndarray, j: int) -> np.ndarray:
        add = np.uint64(15 - j) * prefix
        return m - np.bitwise_count((cum + add) & high).astype(np.intp)

    sum_lanes = np.ones(m)
    for i in range(k):
        idx = np.random.default_rng(seeds[i]).integers(0, m, size=(n_boot, m))
        counts = (weight[i].take(idx) @ sum_lanes).astype(np.uint64)
        cum = counts * prefix
        lo = srt[i].take(order_stat(cum, lo_k))
        out[i] = lo if lo_k == hi_k else (lo + srt[i].take(order_stat(cum, hi_k))) / 2
    return out


_LANE = 5
_PACK_MAX = 10  # 10 lanes of 5 bits: sums below 2**50, exact in a float64's 53-bit mantissa


def percentiles_sorted(rows: np.ndarray, q) -> np.ndarray:
    """Linear-interpolation percentiles ``q`` (in %) of each row of ``rows``, rows already
    sorted ascending and finite: a ``(len(q), k)`` array equal to ``np.percentile(row, q)``
    per row (same virtual index ``(n-1)·q/100`` and the same interpolation)."""
    s = np.asarray(rows, dtype=float)
    n = s.shape[1]
    out = np.empty((len(q), s.shape[0]))
    for j, qq in enumerate(np.true_divide(np.asarray(q, dtype=float), 100)):
        v = (n - 1) * qq
        if v >= n - 1:
            out[j] = s[:, -1]
            continue
        i = int(np.floor(v))
        a, b, t = s[:, i], s[:, i + 1], v - np.floor(v)
        diff = b - a
        out[j] = b - diff * (1 - t) if t >= 0.5 else a + diff * t
    return out


def median_iqr_rows(samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(median, q25, q75)`` (s) of each row of a ``(k, m)`` array of finite step times, ``m >
    0``: per row exactly ``np.median(row)`` and ``iqr(row)``."""
    s = np.sort(np.asarray(samples, dtype=float), axis=1)
    m = s.shape[1]
    med = s[:, m // 2] if m % 2 else (s[:, m // 2 - 1] + s[:, m // 2]) / 2
    q25, q75 = percentiles_sorted(s, [25, 75])
    return med, q25, q75


def percentile_ci_rows(dists, alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray]:
    """``percentile_ci`` of each row of a ``(k, n)`` array of bootstrap distributions:
    ``(lo, hi)`` arrays, exactly the one-row values (rows with non-finite values go one by
    one)."""
    d = np.asarray(dists, dtype=float)
    k = d.shape[0]
    lo, hi = np.full(k, np.nan), np.full(k, np.nan)
    if k == 0 or d.shape[1] == 0:
        return lo, hi
    step = max(1, _CHUNK // d.shape[1])
    for a in range(0, k, step):  # a few MB at a time: no copy of the whole array
        s = np.sort(d[a:a + step], axis=1)  # -inf first, +inf and NaN last
        with np.errstate(invalid="ignore"):  # rows with inf/NaN are redone below
            lo[a:a + step], hi[a:a + step] = percentiles_sorted(
                s, [100 * alpha / 2, 100 * (1 - alpha / 2)])
        for i in np.nonzero(~(np.isfinite(s[:, 0]) & np.isfinite(s[:, -1])))[0]:
            lo[a + i], hi[a + i] = percentile_ci(d[a + i], alpha)
    return lo, hi


_CHUNK = 1 << 19  # values sorted at a time (4 MB)


def percentile_ci(dist: np.ndarray, alpha: float = ALPHA) -> tuple[float, float]:
    """Percentile interval of a bootstrap distribution; NaNs when empty."""
    d = np.asarray(dist, dtype=float)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(d, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi)


def bootstrap_median_ci(groups, n_boot: int = N_BOOT, alpha: float = ALPHA,
                        seed: int = SEED) -> tuple[float, float]:
    """Bootstrap (hierarchical over repeats when given several) ``1-alpha`` CI of the median."""
    return percentile_ci(bootstrap_medians(groups, n_boot, seed), alpha)


def summarize(groups, n_boot: int = N_BOOT, alpha: float = ALPHA, seed: int = SEED) -> dict:
    """``{median, q25, q75, iqr, ci_lo, ci_hi, n_steps, n_repeats}`` of steady-state step
    times (one sample or one per repeat; the median is over the pooled steps)."""
    gs = _as_groups(groups)
    pooled = np.concatenate(gs) if gs else np.empty(0)
    q25, q75 = iqr(pooled)
    lo, hi = bootstrap_median_ci(gs, n_boot, alpha, seed)
    return {
        "median": float(np.median(pooled)) if pooled.size else float("nan"),
        "q25": q25, "q75": q75, "iqr": q75 - q25,
        "ci_lo": lo, "ci_hi": hi,
        "n_steps": int(pooled.size), "n_repeats": len(gs),
    }


def shrunk_mean(x: Sequence[float]) -> float:
    """The mean of ``x`` shrunk toward 0 by its own noise: normal-normal empirical Bayes with
    the prior's variance estimated by the method of moments (``max(0, mean² - se²)``), i.e.
    ``mean · max(0, 1 - se² / mean²)`` with ``se² = var(x, ddof=1) / len(x)`` (the positive-part
    James-Stein estimate of one mean). A mean far above its standard error is kept whole, one
    within it is taken for noise (0). Fewer than two values give no spread to judge by: their
    mean is kept. Pure; any units."""
    v = np.asarray(x, dtype=float)
    if v.size == 0:
        raise ValueError("shrunk_mean of no values")
    m = float(v.mean())
    if v.size < 2 or m == 0.0:
        return m
    se2 = float(v.var(ddof=1)) / v.size
    return m * max(0.0, 1.0 - se2 / m**2)
