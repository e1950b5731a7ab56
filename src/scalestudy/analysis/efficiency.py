"""Scaling efficiency and speedup (pure pandas/numpy).

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

from scalestudy.analysis.stats import ALPHA, percentile_ci_rows
from scalestudy.config.vocab import ScalingMode, member
from scalestudy.config.flops import per_device_throughput
from scalestudy.record.states import RunState

OK = RunState.OK


class InvariantError(ValueError):
    """A series breaks the invariant its scaling mode declares."""


def _mode(mode: str) -> ScalingMode:
    return member(ScalingMode, mode, "mode")


def invariant_problem(series: str, mode: str, ns, tokens_per_step, labels=None) -> str | None:
    """Why one series breaks its invariant (``None`` when it keeps it). Array version of
    ``check_invariant``: ``ns``, ``tokens_per_step`` per point, ``labels`` name the points."""
    what = "tokens per device per step" if _mode(mode) == "weak" else "tokens per step"
    ns = np.asarray(ns, dtype=float)
    v = np.asarray(tokens_per_step, dtype=float) / (ns if mode == "weak" else 1.0)
    if v.size == 0 or (v == v[0]).all():  # (NaNs compare unequal: they go the long way)
        return None
    vals, counts = np.unique(v, return_counts=True)
    ref = vals[np.argmax(counts)]  # the value most points agree on
    bad = ~np.isclose(v, ref, rtol=1e-9, atol=0)
    if not bad.any():
        return None
    labels = [f"N={int(n)}" for n in ns] if labels is None else list(labels)
    pts = ", ".join(f"{labels[i]} ({v[i]:g})" for i in np.nonzero(bad)[0])
    return f"series {series!r}: {what} should be {ref:g} for {mode} scaling, but {pts}"


def check_invariant(df: pd.DataFrame, mode: str) -> None:
    """Raise ``InvariantError`` unless every series (column ``series``, else the whole table)
    keeps tokens per device per step (weak) or tokens per step (strong) constant.
    Needs columns ``n`` and ``tokens_per_step``; names offending points by ``point_id`` (else N)."""
    _mode(mode)
    groups = df.groupby("series", sort=False) if "series" in df.columns else [("(all)", df)]
    problems = []
    for series, g in groups:
        labels = g["point_id"].astype(str).tolist() if "point_id" in g.columns else None
        msg = invariant_problem(str(series), mode, g["n"], g["tokens_per_step"], labels)
        if msg:
            problems.append(msg)
    if problems:
        raise InvariantError("; ".join(problems))


def curve(ns, tokens_per_step, step_time_s, status=None, baseline_n: int | None = None,
          boot: dict | None = None, alpha: float = ALPHA) -> tuple[dict, str]:
    """Array version of ``efficiency_table`` (no invariant check): ``(columns, note)`` with
    ``columns`` a dict of equal-length arrays in the order of ``ns`` (sorted ascending)."""
    ns = np.asarray(ns, dtype=int)
    status = np.full(ns.size, OK, dtype=object) if status is None else np.asarray(status, dtype=object)
    t = np.asarray(step_time_s, dtype=float)
    tok = np.asarray(tokens_per_step, dtype=float)
    with np.errstate(invalid="ignore"):
        ok = (status == OK) & np.isfinite(t) & (t > 0)
    t = np.where(ok, t, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = per_device_throughput(tok, t, ns)
    note, n0 = "", None
    if baseline_n is not None and not (ns == baseline_n).any():
        note = f"baseline N0={baseline_n} is not a point of this series"
    elif baseline_n is not None and not ok[ns == baseline_n].any():
        note = f"baseline N0={baseline_n} did not run successfully ({status[ns == baseline_n][0]}): no curve"
    elif baseline_n is not None:
        n0 = int(baseline_n)
    elif ok.any():
        n0 = int(ns[ok].min())
    else:
        note = "no point ran successfully: no curve"
    nan = np.full(ns.size, np.nan)
    e, e_lo, e_hi, sp, s_lo, s_hi = (nan.copy() for _ in range(6))
    if n0 is not None:
        i0 = int(np.nonzero(ns == n0)[0][0])
        e, sp = x / x[i0], t[i0] / t
        b0 = np.asarray(boot.get(n0, []), dtype=float) if boot is not None else np.empty(0)
        if b0.size:
            rows, dist = [], []
            for i in np.nonzero(ok)[0]:
                bi = np.asarray(boot.get(int(ns[i]), []), dtype=float)
                if bi.size != b0.size:
                    continue
                if ns[i] == n0:  # E(N0) = 1 by definition, no interval
                    e_lo[i] = e_hi[i] = s_lo[i] = s_hi[i] = 1.0
                    continue
                rows.append(i)
                dist.append(bi)
            if rows:  # the ratio distributions of all points at once (row i: point rows[i])
                r, bi = np.array(rows), np.array(dist)
                e_lo[r], e_hi[r] = percentile_ci_rows(
                    (tok[r] / tok[i0])[:, None] * (b0 * n0) / (bi * ns[r][:, None]), alpha)
                s_lo[r], s_hi[r] = percentile_ci_rows(b0 / bi, alpha)
    cols = {
        "n": ns, "baseline_n": np.full(ns.size, float(n0) if n0 is not None else np.nan),
        "step_time_s": t, "tokens_per_step": tok, "tokens_per_s_per_device": x,
        "efficiency": e, "efficiency_ci_lo": e_lo, "efficiency_ci_hi": e_hi,
        "speedup": sp, "speedup_ci_lo": s_lo, "speedup_ci_hi": s_hi,
        "ideal_speedup": ns / n0 if n0 else nan, "status": status,
    }
    return cols, note


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
    else:
        _mode(mode)
    d = df.sort_values("n", kind="stable")
    cols, note = curve(d["n"], d["tokens_per_step"], d["step_time_s"],
                       d["status"] if "status" in d.columns else None, baseline_n, boot, alpha)
    out = pd.DataFrame(cols)
    out["tokens_per_step"] = d["tokens_per_step"].to_numpy()
    out["note"] = note
    return out


def efficiency_loss(mode: str, terms: dict[str, float], terms0: dict[str, float], n: int,
                    n0: int) -> dict[str, float]:
    """The efficiency lost at ``n`` devices term by term, against the baseline ``n0``: with
    T(N) = Σᵢ tᵢ(N) (``terms``: seconds per step at N, ``terms0`` at N₀, the same names),
    weak scaling loses ``(tᵢ(N) − tᵢ(N₀)) / T(N)`` to term i and strong scaling
    ``(tᵢ(N) − tᵢ(N₀)·N₀/N) / T(N)``. The losses add up to 1 − E(N) exactly, E the
    efficiency of these step times (a term that shrank is a negative loss, a gain)."""
    scale = 1.0 if _mode(mode) == ScalingMode.WEAK else n0 / n
    total = sum(terms.values())
    return {k: (terms[k] - terms0.get(k, 0.0) * scale) / total for k in terms}
