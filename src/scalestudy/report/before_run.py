"""The prediction made before a sweep's larger points run (``scalestudy predict STUDY
--before-run``): each series anchored on its measured small points (``perf.anchor``), its
larger points' step and efficiency curve predicted before they start, and how that curve
compares with the measured one once they ran (``predicted_before_run.csv``,
``predict_efficiency_before_run.png``)."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pandas as pd

from scalestudy.analysis.aggregate import collect
from scalestudy.analysis.loss_by_term import run_terms
from scalestudy.config.point import Point
from scalestudy.config.studyspec import Study
from scalestudy.perf import anchor
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import Measured
from scalestudy.perf.stepmodel import predict_step_time
from scalestudy.record.io import read_record, write_csv
from scalestudy.report import style as fstyle


def points_by_hash(points: list[Point]) -> dict:
    """``config_hash -> Point`` of a planned study's feasible points (the first of a config's
    repeats: ``anchor.predict_series`` tells its anchors by identity)."""
    out: dict = {}
    for p in points:
        if p.feasible:
            out.setdefault(p.config_hash, p)
    return out


#: Columns of ``predicted_before_run.csv`` (``before_run_calibration``).
BEFORE_RUN_COLUMNS = ["series", "n", "config_hash", "step_time_s", "software_rate",
                      "calibrated_on", "anchored", "predicted_before_run_s",
                      "predicted_efficiency_before_run", "predicted_efficiency_before_run_low",
                      "predicted_efficiency_before_run_high", "predicted_at",
                      "predicted_before_run_terms_s", "predicted_efficiency_before_run_terms",
                      "term_factors"]


def _term_anchors(anchors: list[tuple[Point, float]], runs, study_dir: Path, hw: HardwareSpec,
                  measured: Measured | None) -> list[tuple[dict, dict]]:
    """``(model terms, measured terms)`` of each anchor whose run has a traced breakdown (its
    first ok run's, set against that run's timed step: ``analysis.loss_by_term.run_terms``)."""
    ok = runs[runs["status"] == "ok"]
    out = []
    for point, _ in anchors:
        mine = ok[ok["config_hash"] == point.config_hash]
        for pid, t in zip(mine["point_id"], mine["step_time_median_s"]):
            rec, _ = run_terms(study_dir / "runs" / str(pid), t)
            if rec is not None:
                out.append((predict_step_time(point, hw, measured).terms(), rec["terms"]))
                break
    return out


def _on_terms(series_points: list[Point], pairs: list[tuple[dict, dict]], hw: HardwareSpec,
              measured: Measured | None) -> tuple[list[float], list[float], str]:
    """The series' steps (s) and efficiencies anchored on the measured terms
    (``perf.anchor.term_factors``), and the factors as text; NaNs without a traced anchor."""
    nan = [float("nan")] * len(series_points)
    if not pairs:
        return nan, nan, ""
    factors, carried = anchor.term_factors(pairs), anchor.carried_share(pairs)
    steps = [anchor.step_on_terms(predict_step_time(p, hw, measured).terms(), factors, carried)
             for p in series_points]
    x = [anchor.per_device_rate(p, t) for p, t in zip(series_points, steps)]
    text = ", ".join(f"{g} {f:.2f}" for g, f in factors.items() if f != 1.0)
    return steps, [xi / x[0] for xi in x], text


def before_run_calibration(pred, runs, max_n: int, predicted_at: str = "", *,
                           points: list[Point], hw: HardwareSpec,
                           measured: Measured | None = None, study_dir: Path | None = None):
    """The model anchored on the measured points with ``n <= max_n`` and its prediction for
    the others, made before they run (``perf.anchor``). Per series, the anchors are its
    measured points with ``n <= max_n``, each with the median over its config's ok runs of
    ``step_time_median_s`` (a series without one takes every series' anchors); the
    framework's ``software_rate`` is solved so that the model passes through them
    (``anchor.anchored_rate``: the geometric mean of the anchors' rates), and the model at
    that rate supplies how the bubble and the communication change with N
    (``anchor.predict_series``: every point of the series, ``points`` being the planned
    study's ``Point`` objects and ``hw``/``measured`` the model inputs of ``pred``).

    No shrinkage: the anchored rate is solved on the measured medians as they are (one
    anchor is passed through exactly; several, each within the spread of their own rates,
    their geometric mean; the curve's efficiency is 1 at the series' smallest N). Shrinking the log rate toward the preset's by the runs' spread
    (``analysis.stats.shrunk_mean``) would move the anchor off its own measurement, so the
    runs' spread is left to the host-noise figures read beside the prediction.

    Rows (``BEFORE_RUN_COLUMNS``): the anchored points (``anchored`` True) and every point
    with ``n > max_n``: ``series, n, config_hash, step_time_s`` (the model at the preset's
    rate), ``software_rate`` (the anchored rate), ``calibrated_on`` (the anchors),
    ``predicted_before_run_s`` (the anchored step), ``predicted_efficiency_before_run`` with
    ``_low``/``_high`` (X(N)/X(N₀) against the series' smallest N, the band over
    ``hw.scenarios()``), ``predicted_at`` (UTC, ISO 8601). With ``study_dir`` and anchors
    that were profiled, the same curve anchored on their measured terms instead of one rate
    (``perf.anchor.term_factors``: the compute rate, each kind of exposed communication, the
    bubble, the optimizer and the waits each scaled to the anchors' traces):
    ``predicted_before_run_terms_s``, ``predicted_efficiency_before_run_terms`` and the
    ``term_factors``. Raises ``ValueError`` when no point with ``n <= max_n`` has been
    measured."""
    ok = runs[runs["status"] == "ok"]
    meas = ok.groupby("config_hash")["step_time_median_s"].median()
    meas = meas[meas > 0]
    by_hash = points_by_hash(points)
    pred = pred[pred["config_hash"].isin(by_hash.keys())]
    small = pred[(pred["n"] <= max_n) & pred["config_hash"].isin(meas.index)]
    if small.empty:
        raise ValueError(f"predict.before_run.calibrate_on_max_n={max_n}: no measured point with "
                         "N <= it to calibrate on (did they run?)")

    def anchors_of(rows) -> list:
        return [(by_hash[h], float(meas[h])) for h in rows["config_hash"]]

    everyone = anchors_of(small)
    rows = []
    for series, g in pred.groupby("series", sort=False):
        g = g.sort_values("n", kind="stable")
        mine = small[small["series"] == series]
        if mine.empty:
            anchors, on = everyone, "all series, N <= %d" % max_n
        else:
            anchors = anchors_of(mine)
            on = f"{series} N=" + ",".join(str(int(n)) for n in sorted(mine["n"]))
        members = [by_hash[h] for h in g["config_hash"]]
        curve = anchor.predict_series(members, anchors, hw, measured)
        pairs = (_term_anchors(anchors, runs, study_dir, hw, measured)
                 if study_dir is not None else [])
        t_steps, t_eff, factors = _on_terms(members, pairs, hw, measured)
        for r, sp, ts, te in zip(g.itertuples(), curve, t_steps, t_eff):
            if r.n <= max_n and not sp.anchored:
                continue  # not measured, not predicted: it was to run before the prediction
            rows.append({"series": series, "n": int(r.n), "config_hash": r.config_hash,
                         "step_time_s": float(r.step_time_s), "software_rate": sp.rate,
                         "calibrated_on": on, "anchored": sp.anchored,
                         "predicted_before_run_s": sp.step_s,
                         "predicted_efficiency_before_run": sp.efficiency,
                         "predicted_efficiency_before_run_low": sp.efficiency_low,
                         "predicted_efficiency_before_run_high": sp.efficiency_high,
                         "predicted_at": predicted_at, "predicted_before_run_terms_s": ts,
                         "predicted_efficiency_before_run_terms": te, "term_factors": factors})
    return pd.DataFrame(rows, columns=BEFORE_RUN_COLUMNS)


def before_run_figure(df, path: Path) -> Path | None:
    """Scaling efficiency E(N) = X(N)/X(N₀) per series (``versus_measured`` frame with a
    ``predicted_before_run.csv`` joined): the measured curve (filled markers, solid line),
    the curve predicted before the run (dashed, open markers, its band over the model's
    scenarios shaded), where the anchors were profiled the curve anchored on their measured
    terms (dotted, crosses), and its anchors (ringed on the measured curve: the points the
    rate was solved on).
    None (nothing written) without a prediction made before the run."""
    col = "predicted_efficiency_before_run"
    if col not in df or not df[col].notna().any():
        return None
    styles = fstyle.series_styles(sorted(df["series"].unique()))
    with fstyle.applied("default"):
        fig, ax = fstyle.new_figure("default")
        ax.axhline(1.0, color="0.5", lw=0.8, linestyle=":", label="ideal (E = 1)")
        ringed = False
        for series, g in df.sort_values("n").groupby("series"):
            st = styles[series]
            if "measured_efficiency" in g and g["measured_efficiency"].notna().any():
                m = g[g["measured_efficiency"].notna()]
                ax.plot(m["n"], m["measured_efficiency"], color=st["color"], marker=st["marker"],
                        linestyle="-", label=f"{series}: measured")
            p = g[g[col].notna()]
            if p.empty:
                continue
            rate = p["software_rate"].iloc[0] if "software_rate" in p else float("nan")
            ax.fill_between(p["n"], p[f"{col}_low"], p[f"{col}_high"], color=st["color"],
                            alpha=0.15, linewidth=0)
            ax.plot(p["n"], p[col], color=st["color"], marker=st["marker"], linestyle="--",
                    markerfacecolor="none", markersize=9,
                    label=f"{series}: predicted before run (rate {rate:.2f})")
            terms = f"{col}_terms"
            if terms in p and p[terms].notna().any():
                q = p[p[terms].notna()]
                ax.plot(q["n"], q[terms], color=st["color"], linestyle=":", marker="x",
                        label=f"{series}: predicted before run, on the anchors' measured terms")
            a = p[p["anchored"].astype("boolean").fillna(False).astype(bool)] \
                if "anchored" in p else p.iloc[:0]
            if not a.empty:  # ringed where they were measured
                y = a["measured_efficiency"].fillna(a[col]) if "measured_efficiency" in a \
                    else a[col]
                ax.scatter(a["n"], y, s=260, facecolors="none", edgecolors="0.2",
                           linewidths=1.2, zorder=4, label=None if ringed else "anchor (measured)")
                ringed = True
        ax.set_xscale("log", base=2)
        ns = sorted(int(n) for n in df["n"].unique())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("devices N (log2)")
        ax.set_ylabel("scaling efficiency E(N) = X(N)/X(N₀)")
        ax.set_title("Efficiency predicted before the run vs measured\n(shaded: the model's "
                     "range, its rate re-solved on the anchors)", fontsize=10)
        fstyle.legend(fig, ax, "default")
        return fstyle.save(fig, path)[0]


def started_before(vm, runs, study_dir: Path):
    """``vm`` with ``started_at`` (the first start of each config's runs, UTC, from their
    ``status.json``) and ``predicted_before_start`` (the prediction's ``predicted_at`` is
    earlier: it was made before the point ran; NA where either is unknown)."""
    starts = {}
    for h, g in runs.groupby("config_hash"):
        t = [x for x in (_started(study_dir, pid) for pid in g["point_id"]) if x]
        starts[h] = min(t, key=pd.Timestamp) if t else None
    out = vm.copy()
    out["started_at"] = out["config_hash"].map(starts)
    pa = pd.to_datetime(out.get("predicted_at"), utc=True, errors="coerce", format="ISO8601")
    st = pd.to_datetime(out["started_at"], utc=True, errors="coerce", format="ISO8601")
    out["predicted_before_start"] = (pa < st).where(pa.notna() & st.notna())
    return out


def _started(study_dir: Path, point_id) -> str | None:
    """When a point's run started (``status.json`` ``started``, UTC), or None."""
    if not point_id or not isinstance(point_id, str):
        return None
    rec = read_record(study_dir / "runs" / point_id / "status.json")
    return (rec or {}).get("started")


def write_before_run(study: Study, pred, study_dir: Path, path: Path, *,
                        points: list[Point], hw: HardwareSpec,
                        measured: Measured | None = None) -> int:
    """``scalestudy predict STUDY --before-run``: write ``predicted_before_run.csv`` (the
    model anchored on the measured points with N <= calibrate_on_max_n, ``points`` the
    study's planned points and ``hw``/``measured`` the model inputs of ``pred``)."""
    max_n = study.predict.before_run_max_n
    if max_n is None:
        print("scalestudy predict: --before-run needs predict: {before_run: "
              "{calibrate_on_max_n: N}} in the study file", file=sys.stderr)
        return 2
    runs, _, _ = collect(study_dir)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
    try:
        before = before_run_calibration(pred, runs, max_n, now, points=points, hw=hw,
                                        measured=measured, study_dir=study_dir)
    except ValueError as e:
        print(f"scalestudy predict: {e}", file=sys.stderr)
        return 2
    write_csv(before, path)
    for r in before.itertuples():
        eff = (f"efficiency {r.predicted_efficiency_before_run:.1%} "
               f"[{r.predicted_efficiency_before_run_low:.1%}, "
               f"{r.predicted_efficiency_before_run_high:.1%}]")
        what = "anchor (measured)" if r.anchored else "predicted before run"
        print(f"{r.series} N={r.n}: {what} {r.predicted_before_run_s * 1e3:.1f} ms, {eff} "
              f"(model {r.step_time_s * 1e3:.1f} ms at the preset's rate; anchored rate "
              f"{r.software_rate:.2f} on {r.calibrated_on})"
              + (f"; on the anchors' measured terms {r.predicted_before_run_terms_s * 1e3:.1f} "
                 f"ms, efficiency {r.predicted_efficiency_before_run_terms:.1%} ({r.term_factors})"
                 if r.term_factors else ""))
    print(f"-> {path}")
    return 0
