"""``scalestudy predict``: predicted step time, MFU and weak/strong scaling efficiency, each with
its range and the breakdown of the step into named terms, for a study's own points and at real
scale next to published results.

    scalestudy predict [STUDY.yaml] [--hardware frontier] [--framework NAME] [--out DIR]
        [--runs runs.csv] [--matmul-csv M.csv] [--collectives-csv C.csv] [--dp-overlap F]

With a study file, every feasible point of the study is predicted on ``--hardware``
(default: ``cpu-local`` for a CPU study; building blocks measured by the study's
``microbench`` jobs, else the matmul ceiling of its ``calibration.json``, are used when
present and no ``--hardware`` is named): ``study_predictions.csv`` (with ``step_time_low_s``
/ ``step_time_high_s``), ``study_breakdown.csv`` and ``study_breakdown.png`` (the step of
every point split into its terms), ``breakdown_predicted.csv`` and
``efficiency_loss_predicted.csv`` (the model's side of the study's ``breakdown.csv`` and
``efficiency_loss.csv``: ``analysis.loss_by_term.predicted_tables``); where the study has been run
(``results/<study>/runs.csv``) the measured step time is set against it with the residual
``(predicted - measured) / measured``: ``predict_vs_measured.csv`` and ``.png``; and where it
was profiled (``breakdown.csv``) every term against its measurement:
``terms_vs_measured.csv``, with each term's median predicted / measured printed.

Without a study, or when the study lists ``references: [frontier_dash2024]``, the Frontier
study (``scalestudy.validation.frontier``) is compared at real scale on ``--hardware`` (default
``frontier``): ``predict_vs_published.csv`` / ``.md`` (predicted value, its range, the
published value and whether it lies inside; the % of peak in both means of the logged lines,
the strong series at both assumed batches), ``predict_points.csv``, ``predict_breakdown.csv``
/ ``predict_breakdown.png`` and the figures ``predict_mfu.png`` / ``predict_scaling.png``.

``--validate`` runs the model over every shipped published table
(``scalestudy.validation.published``, ``data/published/``) with the fitted constants of
``data/perf_fit.yaml``: ``validation.csv`` (every row: predicted, published, error, or why it
is not modelled), ``validation_summary.csv``, ``validation.md`` (per table MAPE, bias, worst
row, in the fit or not, leave-one-table-out) and ``validation.png``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from scalestudy.analysis.loss_by_term import term_ratio_summary, terms_versus_measured  # noqa: E402
from scalestudy.config.point import Point  # noqa: E402
from scalestudy.perf import stepmodel  # noqa: E402
from scalestudy.config.flops import per_device_throughput  # noqa: E402
from scalestudy.perf.hardware import HardwareSpec  # noqa: E402
from scalestudy.perf.rates import Measured  # noqa: E402
from scalestudy.perf.tables import breakdown_row, shape_columns  # noqa: E402
from scalestudy.record.io import write_csv  # noqa: E402
from scalestudy.record.terms import TERM_LABELS  # noqa: E402
from scalestudy.report import style as fstyle  # noqa: E402



def markdown(comp, hw: HardwareSpec, brk=None) -> str:
    lines = [
        f"# Predicted vs published (Dash et al. 2024, Frontier) on hardware `{hw.name}` "
        f"(framework `{hw.framework.name}`)",
        "",
        "| model | metric | N (GCDs) | predicted | range | published | rel. error | inside |",
        "|---|---|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in comp.itertuples():
        lines.append(f"| {r.model} | {r.metric} | {r.n} | {r.predicted:.2f} | "
                     f"{r.predicted_low:.2f} – {r.predicted_high:.2f} | {r.published:.2f} "
                     f"| {r.rel_error:+.1%} | {'yes' if r.inside else 'no'} |")
    lines += ["", "Range: the envelope over every assumption of the hardware and framework "
              "description at the ends of its stated range (all slow, all fast, each alone; "
              "docs/performance-model.md). The % of peak is given for both means of the logged "
              "lines (the evaluation at the ratio the study's log shows); the strong series at "
              "both global batches, neither published. The one fitted constant (`sustained`, "
              "data/perf_fit.yaml) was fitted on other tables: these rows are out of sample."]
    if brk is not None and not brk.empty:
        head = brk[brk["point"].str.contains(" mfu ")]
        if not head.empty:
            keys = [k for k in TERM_LABELS if k in head]
            lines += ["", "Breakdown of the published points (% of the logged iteration):", "",
                      "| point | " + " | ".join(TERM_LABELS[k] for k in keys) + " |",
                      "|---|" + "---:|" * len(keys)]
            for r in head.itertuples():
                lines.append(f"| {r.point} | " + " | ".join(
                    f"{getattr(r, 'pct_' + k[:-2]):.1f}" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def figures(df, comp, out: Path) -> list[Path]:
    """``predict_mfu.png`` (% of peak per model: both means of the logged lines, with their
    ranges, and the published value) and ``predict_scaling.png`` (weak and strong efficiency
    per model, both strong batches, the published points), in the project's figure style."""
    paths = []
    with fstyle.applied("default"):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        models = list(dict.fromkeys(comp["model"]))
        x = range(len(models))
        for j, (label, key) in enumerate((("predicted, time-weighted mean", "time-weighted"),
                                          ("predicted, per-line mean", "per-line"))):
            c = comp[comp["metric"].str.contains(key)].set_index("model").loc[models]
            err = [c["predicted"] - c["predicted_low"], c["predicted_high"] - c["predicted"]]
            ax.bar([i + (j - 1) * 0.27 for i in x], c["predicted"], width=0.27, yerr=err,
                   capsize=3, label=label, color=fstyle.PALETTE[j])
        pub = comp[comp["metric"].str.contains("time-weighted")].set_index("model").loc[models]
        ax.bar([i + 0.27 for i in x], pub["published"], width=0.27, label="published",
               color=fstyle.PALETTE[-1])
        ax.set_xticks(list(x), models)
        ax.set_ylabel("% of 191.5 TFLOPS (recompute counted)")
        ax.set_title("Per-GCD utilisation: model vs Dash et al. 2024")
        ax.legend(fontsize=8)
        fig.tight_layout()
        paths.append(_save(fig, out / "predict_mfu.png"))

        fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
        st = fstyle.series_styles(sorted(df["model"].unique()))
        for ax, kind in zip(axes, ("weak", "strong")):
            for model, g in df[df["series"] == kind].groupby("model"):
                g, s = g.sort_values("n"), st[model]
                ax.plot(g["n"], 100 * g["efficiency"], marker=s["marker"], color=s["color"],
                        label=f"{model} predicted")
                ax.fill_between(g["n"], 100 * g["efficiency_low"], 100 * g["efficiency_high"],
                                color=s["color"], alpha=0.15)
                alt = df[(df["series"] == f"{kind}_alt") & (df["model"] == model)].sort_values("n")
                if not alt.empty:  # the other assumed strong-scaling batch
                    ax.plot(alt["n"], 100 * alt["efficiency"], "--", marker=".", color=s["color"],
                            label=f"{model} predicted, script's batch")
                pub = comp[(comp["model"] == model) & comp["metric"].str.startswith(kind)]
                if not pub.empty:
                    ax.scatter(pub["n"].iloc[:1], pub["published"].iloc[:1], marker="*", s=150,
                               color=s["color"], label=f"{model} published")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GCDs")
            ax.set_title(f"{kind} scaling")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        axes[0].set_ylabel("efficiency (%)")
        fig.tight_layout()
        paths.append(_save(fig, out / "predict_scaling.png"))
    return paths


def model_breakdown_figure(brk, path: Path, title: str = "Where the step goes") -> Path:
    """A stacked bar per point: each term's share (%) of the (logged) step time, in the
    project's figure style (``report.style``: palette, fonts, legend beside the axes)."""
    keys = [k for k in TERM_LABELS if k in brk and (brk[k] > 0).any()]
    styles = fstyle.term_styles()
    with fstyle.applied("default"):
        w, h = fstyle.STYLES["default"]["size"]
        fig, ax = plt.subplots(figsize=(max(w, 0.45 * len(brk) + 3), h))
        bottom = [0.0] * len(brk)
        x = list(range(len(brk)))
        for k in keys:
            vals = brk[f"pct_{k[:-2]}"].tolist()
            ax.bar(x, vals, bottom=bottom, label=TERM_LABELS[k], color=styles[k]["color"],
                   hatch=styles[k]["hatch"], edgecolor="white", linewidth=0.5)
            bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_xticks(x, brk["point"], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("% of step time")
        ax.set_ylim(0, 100)
        ax.set_title(title, fontsize=10)
        fstyle.legend(fig, ax, "default")
        return _save(fig, path)


def study_predictions(points: list[Point], hw: HardwareSpec,
                      measured: Measured | None = None,
                      dp_overlap: float | None = None, breakdown: list | None = None):
    """Predicted step time (with its range), throughput, MFU and efficiency (vs each series'
    ``baseline_n``) of the feasible points of a planned study (one row per config, repeats
    collapsed). ``breakdown``: a list that receives each point's ``breakdown_row``."""
    rows, seen = [], set()
    for p in points:
        if not p.feasible or p.config_hash in seen:
            continue
        seen.add(p.config_hash)
        pr = stepmodel.predict_range(p, hw, measured, dp_overlap)
        b = pr.central
        rows.append({"series": p.series, "mode": p.mode, **shape_columns(p),
                     "config_hash": p.config_hash,
                     "baseline_n": p.baseline_n, "model": p.model.name,
                     **{k: v for k, v in b.row().items() if isinstance(v, (int, float, str))},
                     "step_time_low_s": pr.step_time_low_s,
                     "step_time_high_s": pr.step_time_high_s})
        if breakdown is not None:
            breakdown.append(breakdown_row(f"{p.series} N={p.n}", b, p))
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    x = per_device_throughput(df["tokens_per_step"], df["step_time_s"], df["n"])
    base = {(r.series, r.n): xi for r, xi in zip(df.itertuples(), x)}
    df["predicted_efficiency"] = [xi / base.get((r.series, r.baseline_n), float("nan"))
                                  for r, xi in zip(df.itertuples(), x)]
    return df


def versus_measured(pred, runs, before=None):
    """Predicted vs measured step time per config: ``measured_step_time_s`` (median over the
    ok repeats of each run's median), ``residual = (predicted - measured) / measured``.
    With ``tokens_per_step`` in ``pred``: ``measured_efficiency``, the measured X(N)/X(N₀)
    against the series' smallest N (NA where either is not measured).
    ``before``: a ``predicted_before_run.csv`` frame (``before_run_calibration``): its
    anchored curve (``software_rate``, ``calibrated_on``, ``anchored``,
    ``predicted_efficiency_before_run`` and its ``_low``/``_high``) joins every point it
    has; ``predicted_before_run_s`` and ``predicted_at`` only the points predicted before
    they ran (not the anchors, which were measured first), with ``before_run_residual`` (the
    same residual for the prediction made before the run)."""
    ok = runs[runs["status"] == "ok"]
    meas = ok.groupby("config_hash", as_index=False)["step_time_median_s"].median()
    meas = meas.rename(columns={"step_time_median_s": "measured_step_time_s"})
    out = pred.merge(meas, on="config_hash", how="left")
    out["residual"] = (out["step_time_s"] - out["measured_step_time_s"]) / out["measured_step_time_s"]
    if "tokens_per_step" in out and not out.empty:
        x = per_device_throughput(out["tokens_per_step"], out["measured_step_time_s"], out["n"])
        n0 = out.groupby("series")["n"].transform("min")
        x0 = x.where(out["n"] == n0).groupby(out["series"]).transform("max")
        out["measured_efficiency"] = x / x0
    if before is not None and not before.empty:
        cols = ["config_hash", "predicted_before_run_s", "calibration_factor", "software_rate",
                "calibrated_on", "anchored", "predicted_efficiency_before_run",
                "predicted_efficiency_before_run_low", "predicted_efficiency_before_run_high",
                "predicted_at", "predicted_before_run_terms_s",
                "predicted_efficiency_before_run_terms", "term_factors"]
        out = out.merge(before[[c for c in cols if c in before]], on="config_hash", how="left")
        if "anchored" in out:
            anchored = out["anchored"].astype("boolean").fillna(False).astype(bool)
            out.loc[anchored, ["predicted_before_run_s", "predicted_at"]] = None
        out["before_run_residual"] = ((out["predicted_before_run_s"] - out["measured_step_time_s"])
                                      / out["measured_step_time_s"])
    return out


def terms_check(predicted: pd.DataFrame, breakdown_csv: Path, out: Path) -> None:
    """The model term by term against the study's traced breakdown (``breakdown.csv``):
    ``terms_vs_measured.csv`` (every point and term) and, printed, per term its median
    predicted / measured; nothing where the study was not profiled."""
    if predicted.empty or not breakdown_csv.exists():
        return
    df = terms_versus_measured(predicted, pd.read_csv(breakdown_csv))
    if df.empty:
        print("no traced breakdown to compare the terms with (profile: {enabled: true})")
        return
    write_csv(df, out / "terms_vs_measured.csv")
    summary = term_ratio_summary(df)
    print("per term, predicted / measured (median over points [lowest, highest], share of the "
          "measured steps):")
    for r in summary.itertuples():
        print(f"  {r.label:<40} {r.median_ratio:6.2f} [{r.min_ratio:.2f}, {r.max_ratio:.2f}]"
              f"  {r.points} points, {r.measured_share:.0%} of the time")


def _save(fig, path: Path) -> Path:
    """Write a matplotlib figure atomically and close it."""
    return fstyle.save(fig, path)[0]


def residual_figure(df, path: Path) -> Path:
    """Step time vs N per series: the model (line), the measurement (filled markers) and,
    where the study asked for it, the prediction made before the point ran (open markers);
    below, the residuals (%) with the ±30% band. The project's figure style
    (``report.style``: Okabe–Ito palette, a marker and line style per series)."""
    before = "predicted_before_run_s" in df and df["predicted_before_run_s"].notna().any()
    styles = fstyle.series_styles(sorted(df["series"].unique()))
    with fstyle.applied("default"):
        fig, (ax, axr) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
        for series, g in df.sort_values("n").groupby("series"):
            st = styles[series]
            ax.plot(g["n"], g["step_time_s"], color=st["color"], linestyle=st["linestyle"],
                    label=f"{series}: model")
            ax.plot(g["n"], g["measured_step_time_s"], linestyle="none", marker=st["marker"],
                    color=st["color"], label=f"{series}: measured")
            axr.plot(g["n"], 100 * g["residual"], color=st["color"], marker=st["marker"],
                     linestyle=st["linestyle"])
            if before:
                b = g[g["predicted_before_run_s"].notna()]
                if not b.empty:
                    ax.plot(b["n"], b["predicted_before_run_s"], linestyle="none",
                            marker=st["marker"], markerfacecolor="none", markersize=10,
                            color=st["color"], label=f"{series}: predicted before run")
                    axr.plot(b["n"], 100 * b["before_run_residual"], linestyle="none",
                             marker=st["marker"], markerfacecolor="none", markersize=10,
                             color=st["color"])
        ax.set_ylabel("step time (s)")
        ax.set_yscale("log")
        ax.set_title("Performance model vs measurement" + (
            "\n(open markers: predicted before the point ran)" if before else ""), fontsize=10)
        axr.axhspan(-30, 30, color="0.9", zorder=0)
        axr.axhline(0, color="0.4", lw=0.8)
        axr.set_ylabel("(predicted − measured)\n/ measured (%)")
        axr.set_xlabel("devices N (log2)")
        axr.set_xscale("log", base=2)
        ns = sorted(int(n) for n in df["n"].unique())
        axr.set_xticks(ns, [str(n) for n in ns])
        fstyle.legend(fig, ax, "default")
        return _save(fig, path)
