"""Steady-state window, medians, IQR and bootstrap confidence intervals of step times.

Pure numpy. Times are seconds; every bootstrap uses a fixed seed so a table is reproducible.
Repeats of a point are separate jobs: their uncertainty enters through a *hierarchical*
bootstrap (resample repeats, then steps within each drawn repeat, then take the median).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
ALPHA = 0.05


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
    gs = _as_groups(groups)
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
