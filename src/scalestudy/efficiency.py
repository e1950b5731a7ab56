"""Scaling efficiency and speedup (pure pandas/numpy; DESIGN.md §3).

Per-device throughput ``X(N) = tokens_per_step / (T(N) · N)`` (tokens/s per device, T = median
step time in s). Efficiency ``E(N) = X(N) / X(N0)``; speedup ``S(N) = T(N0) / T(N)``.
Weak scaling (tokens per device per step fixed): ``E = T(N0)/T(N)``. Strong scaling (tokens
per step fixed): ``E = T(N0)·N0 / (T(N)·N)``. The baseline ``N0`` is the series'
``baseline_n`` when given, else the smallest N that ran successfully. The 95% CI comes from
the ratio of independent bootstrap distributions of T(N) and T(N0).

A curve is only meaningful when the series keeps its invariant: ``check_invariant`` raises
``InvariantError`` naming the points that break it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scalestudy.stats import ALPHA, percentile_ci

MODES = ("weak", "strong")
OK = "ok"


class InvariantError(ValueError):
    """A series breaks the invariant its scaling mode declares."""


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; allowed: {', '.join(MODES)}")
    return mode


def invariant_value(df: pd.DataFrame, mode: str) -> pd.Series:
    """Tokens per device per step (weak) or tokens per step (strong), per row."""
    if _mode(mode) == "weak":
        return df["tokens_per_step"].astype(float) / df["n"].astype(float)
    return df["tokens_per_step"].astype(float)


def check_invariant(df: pd.DataFrame, mode: str) -> None:
    """Raise ``InvariantError`` unless every series (column ``series``, else the whole table)
    keeps tokens per device per step (weak) or tokens per step (strong) constant.
    Needs columns ``n`` and ``tokens_per_step``; names offending points by ``point_id`` (else N)."""
    what = "tokens per device per step" if _mode(mode) == "weak" else "tokens per step"
    groups = df.groupby("series", sort=False) if "series" in df.columns else [("(all)", df)]
    problems = []
    for series, g in groups:
        v = invariant_value(g, mode)
        ref = v.mode().iloc[0] if len(v) else None  # the value most points agree on
        bad = g[~np.isclose(v, ref, rtol=1e-9, atol=0)]
        if len(bad):
            label = bad["point_id"] if "point_id" in bad.columns else "N=" + bad["n"].astype(str)
            vals = invariant_value(bad, mode)
            pts = ", ".join(f"{p} ({x:g})" for p, x in zip(label, vals))
            problems.append(f"series {series!r}: {what} should be {ref:g} for {mode} scaling, "
                            f"but {pts}")
    if problems:
        raise InvariantError("; ".join(problems))


def efficiency_table(
    df: pd.DataFrame,
    mode: str,
    baseline_n: int | None = None,
    boot: dict | None = None,
    alpha: float = ALPHA,
    check: bool = True,
) -> pd.DataFrame:
    """Efficiency curve of one series.

    ``df``: one row per N with ``n``, ``tokens_per_step``, ``step_time_s`` (median, s) and
    optionally ``status`` (``ok`` or a failure state; failed rows keep their row with NaNs).
    ``boot``: optional ``{n: bootstrap distribution of T(N)}`` (equal lengths) for the CIs.
    The invariant is checked first (``InvariantError``; ``check=False`` skips it, for
    tabulating throughput of a series that gets no curve). Returns columns ``n, baseline_n,
    step_time_s, tokens_per_step, tokens_per_s_per_device, efficiency, efficiency_ci_lo,
    efficiency_ci_hi, speedup, speedup_ci_lo, speedup_ci_hi, ideal_speedup, status, note``.
    """
    if check:
        check_invariant(df.assign(series="(this series)") if "series" not in df.columns else df, mode)
    d = df.sort_values("n").reset_index(drop=True).copy()
    if "status" not in d.columns:
        d["status"] = OK
    ok = (d["status"] == OK) & np.isfinite(d["step_time_s"].astype(float)) & (d["step_time_s"] > 0)
    n = d["n"].astype(float)
    t = d["step_time_s"].astype(float).where(ok)
    x = d["tokens_per_step"].astype(float) / (t * n)
    out = pd.DataFrame({
        "n": d["n"].astype(int), "step_time_s": t, "tokens_per_step": d["tokens_per_step"],
        "tokens_per_s_per_device": x, "status": d["status"],
    })
    note = ""
    if baseline_n is not None and not (d["n"] == baseline_n).any():
        note = f"baseline N0={baseline_n} is not a point of this series"
        n0 = None
    elif baseline_n is not None and not ok[d["n"] == baseline_n].any():
        state = d.loc[d["n"] == baseline_n, "status"].iloc[0]
        note = f"baseline N0={baseline_n} did not run successfully ({state}): no curve"
        n0 = None
    else:
        n0 = int(baseline_n) if baseline_n is not None else (int(d.loc[ok, "n"].min()) if ok.any() else None)
        if n0 is None:
            note = "no point ran successfully: no curve"
    out["baseline_n"] = n0 if n0 is not None else np.nan
    out["ideal_speedup"] = n / n0 if n0 else np.nan
    for c in ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup", "speedup_ci_lo", "speedup_ci_hi"):
        out[c] = np.nan
    if n0 is not None:
        i0 = int(np.nonzero((d["n"] == n0).to_numpy())[0][0])
        t0, x0 = t.iloc[i0], x.iloc[i0]
        out["efficiency"] = x / x0
        out["speedup"] = t0 / t
        if boot is not None and n0 in boot and len(boot[n0]):
            b0 = np.asarray(boot[n0], dtype=float)
            for i in np.nonzero(ok.to_numpy())[0]:
                bi = np.asarray(boot.get(int(d["n"].iloc[i]), []), dtype=float)
                if bi.size != b0.size or bi.size == 0:
                    continue
                if int(d["n"].iloc[i]) == n0:  # E(N0) = 1 by definition, no interval
                    lo_e = hi_e = lo_s = hi_s = 1.0
                else:
                    tok_ratio = float(d["tokens_per_step"].iloc[i]) / float(d["tokens_per_step"].iloc[i0])
                    eff = tok_ratio * (b0 * n0) / (bi * float(n.iloc[i]))
                    lo_e, hi_e = percentile_ci(eff, alpha)
                    lo_s, hi_s = percentile_ci(b0 / bi, alpha)
                out.loc[i, ["efficiency_ci_lo", "efficiency_ci_hi", "speedup_ci_lo", "speedup_ci_hi"]] = (
                    lo_e, hi_e, lo_s, hi_s)
    out["note"] = note
    cols = ["n", "baseline_n", "step_time_s", "tokens_per_step", "tokens_per_s_per_device",
            "efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup", "speedup_ci_lo",
            "speedup_ci_hi", "ideal_speedup", "status", "note"]
    return out[cols]
