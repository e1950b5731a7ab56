"""Figures from ``runs.csv`` / ``efficiency.csv`` (seaborn, Agg backend).

    scalestudy plot RESULTS/STUDY

Writes under ``figures/``, each as PNG and PDF plus the CSV it was drawn from:
``efficiency_weak``, ``efficiency_strong`` (efficiency vs N, log2 x axis, ideal line, 95% CI
band), ``throughput`` (tokens/s per device vs N), ``mfu`` (MFU vs N; utilisation against
the measured matmul ceiling when no spec peak is known) and ``breakdown`` (per series the
step split into its terms at each N and the efficiency lost term by term, measured beside the
model: ``breakdown.csv``, ``efficiency_loss.csv``). Points that did not run (oom,
timeout, crashed, infeasible, invalid, not run) are drawn as distinct markers on a strip at
the bottom of the axes, so a reader sees where scaling broke. Published references named by
the study (``references`` in ``study.json``, or the ``references`` argument) are overlaid in
the same units. ``style`` (``report.figure_style`` of the study, or ``--style``): ``default``,
``single-column`` or ``double-column`` (``scalestudy.report.style``: paper widths, TrueType
fonts embedded in the PDFs, a colour-blind-safe palette, a marker and line style per series).
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms as mtransforms  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from scalestudy.analysis.loss_by_term import BREAKDOWN_COLUMNS, LOSS_COLUMNS  # noqa: E402
from scalestudy.record.io import (clean_temps, refuse_escaping_links,  # noqa: E402
                                  tables_lock, write_text)
from scalestudy.record.run_records import read_study  # noqa: E402
from scalestudy.record.terms import MEASURED_TERMS, TERM_LABELS  # noqa: E402
from scalestudy.report import references as refs  # noqa: E402
from scalestudy.report import style as fstyle  # noqa: E402
from scalestudy.report.breakdown import joined, model_side  # noqa: E402
from scalestudy.report.summary import CPU_NOTE  # noqa: E402

FIGURES = ("efficiency_weak", "efficiency_strong", "throughput", "mfu", "breakdown")
FAIL_MARKERS = {"oom": "X", "timeout": "v", "crashed": "P", "invalid": "*",
                "infeasible": "D", "not_run": "o"}
FAIL_LABEL = {"oom": "out of memory", "timeout": "timeout", "crashed": "crashed",
              "invalid": "invalid", "infeasible": "infeasible (planner)", "not_run": "not run"}
REF_MARKERS = ["s", "^", "p", "h", "8"]
#: The model's bars beside the measured ones in the breakdown figure: the same colours, lighter.
MODEL_ALPHA = 0.45


def _save(fig, out_dir: Path, name: str, data: pd.DataFrame, style: str = "default") -> list[Path]:
    paths = fstyle.save(fig, [out_dir / f"{name}.png", out_dir / f"{name}.pdf"], style)
    path = out_dir / f"{name}.csv"
    write_text(path, data.to_csv(index=False, float_format="%.6g"))
    return paths + [path]


def _log2_axis(ax, ns) -> None:
    ns = sorted({int(n) for n in ns if pd.notna(n) and n > 0})
    ax.set_xscale("log", base=2)
    if ns:
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.minorticks_off()
        lo, hi = ns[0], ns[-1]
        ax.set_xlim(lo / 1.4, hi * 1.4)


def _failed_strip(ax, failed: pd.DataFrame, palette: dict) -> None:
    """Failed points on a strip at the bottom of the axes (x in data units, y in axes units)."""
    if failed.empty:
        return
    trans = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    order = list(palette)
    k = len(order)
    for status, g in failed.groupby("status"):
        for r in g.itertuples(index=False):
            # dodge series sharing an N (multiplicative: the x axis is log2)
            i = order.index(r.series) if r.series in order else 0
            x = r.n * 2 ** (0.12 * (i - (k - 1) / 2))
            ax.scatter([x], [0.04], transform=trans, marker=FAIL_MARKERS.get(status, "x"),
                       s=70, color=palette.get(r.series, "0.3"), edgecolor="black",
                       linewidth=0.6, zorder=5, clip_on=False)
        ax.scatter([], [], marker=FAIL_MARKERS.get(status, "x"), color="0.6", edgecolor="black",
                   s=70, label=f"did not run: {FAIL_LABEL.get(status, status)}")


def _palette(series) -> dict:
    """Colour per series (``style.PALETTE``: Okabe–Ito, colour-blind safe)."""
    return {s: v["color"] for s, v in fstyle.series_styles(series).items()}


def _lines(ax, data: pd.DataFrame, y: str, styles: dict) -> None:
    """One line per series, each with its own colour, marker and line style."""
    for s, g in data.groupby("series", sort=False):
        g = g.sort_values("n")
        st = styles[s]
        ax.plot(g["n"], g[y], color=st["color"], marker=st["marker"], linestyle=st["linestyle"],
                label=str(s))


def _empty(out_dir: Path, name: str, message: str, columns, style: str = "default") -> list[Path]:
    fig, ax = fstyle.new_figure(style)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes,
            fontsize=11 if style == "default" else 8)
    ax.set_axis_off()
    return _save(fig, out_dir, name, pd.DataFrame(columns=list(columns)), style)


def _cpu(runs: pd.DataFrame) -> bool:
    return bool((runs["device_type"] == "cpu").any()) if "device_type" in runs else False


def efficiency_figure(eff: pd.DataFrame, runs: pd.DataFrame, mode: str, out_dir: Path,
                      references: list[str], style: str = "default") -> list[Path]:
    name = f"efficiency_{mode}"
    d = eff[eff["mode"] == mode].copy()
    if d.empty:
        return _empty(out_dir, name, f"no {mode}-scaling series in this study", eff.columns,
                      style)
    styles = fstyle.series_styles(d["series"])
    palette = _palette(d["series"])
    ok = d[d["efficiency"].notna()]
    failed = d[d["status"] != "ok"]
    fig, ax = fstyle.new_figure(style)
    if not ok.empty:
        _lines(ax, ok, "efficiency", styles)
        for s, g in ok.groupby("series"):
            if g["efficiency_ci_lo"].notna().any():
                ax.fill_between(g["n"], g["efficiency_ci_lo"], g["efficiency_ci_hi"],
                                color=palette[s], alpha=0.2, linewidth=0)
    nocurve = d[(d["status"] == "ok") & d["efficiency"].isna()]
    all_n = list(d["n"])
    ref_rows = []
    for i, ref in enumerate(references):
        if ref not in refs.REFERENCES:
            continue
        pts = refs.efficiency_points(ref)
        pts = pts[pts["mode"] == mode]
        for j, r in enumerate(pts.itertuples(index=False)):
            ax.scatter([r.n], [r.efficiency], marker=REF_MARKERS[(i + j) % len(REF_MARKERS)],
                       s=60, facecolor="none", edgecolor="black", linewidth=1.2, zorder=6,
                       label=f"{r.label}: {r.efficiency:.1%} at N={r.n} (vs. their own N₀)")
            all_n.append(r.n)
        ref_rows.append(pts)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="ideal (E = 1)")
    _failed_strip(ax, failed, palette)
    _log2_axis(ax, all_n)
    ymax = max(1.15, float(np.nanmax(ok[["efficiency", "efficiency_ci_hi"]].to_numpy()) * 1.05)
               if not ok.empty else 1.15)
    ax.set_ylim(0, ymax)
    ax.set_xlabel("devices N (log2)")
    ax.set_ylabel("scaling efficiency E(N) = X(N)/X(N₀)")
    inv = "tokens per device per step fixed" if mode == "weak" else "tokens per step fixed"
    title = f"{mode.capitalize()} scaling ({inv}); band: 95% CI"
    if not nocurve.empty:
        title += "\nno curve for: " + ", ".join(sorted(set(nocurve["series"])))
    ax.set_title(title, fontsize=10 if style == "default" else None)
    if _cpu(runs) and style == "default":
        fig.text(0.01, -0.02, CPU_NOTE, fontsize=7, color="0.35")
    fstyle.legend(fig, ax, style)
    data = d.assign(kind="measured")
    if ref_rows:
        r = pd.concat(ref_rows, ignore_index=True).rename(columns={"reference": "series"})
        data = pd.concat([data, r.assign(kind="reference")], ignore_index=True)
    return _save(fig, out_dir, name, data, style)


def _per_n_metric_figure(eff: pd.DataFrame, runs: pd.DataFrame, out_dir: Path, name: str,
                         ycol: str, ylabel: str, title: str, percent: bool,
                         ref_lines: pd.DataFrame | None = None,
                         style: str = "default") -> list[Path]:
    d = eff.copy()
    if d.empty:
        return _empty(out_dir, name, "no points in this study", eff.columns, style)
    styles = fstyle.series_styles(d["series"])
    palette = _palette(d["series"])
    ok = d[d[ycol].notna()]
    failed = d[d["status"] != "ok"]
    fig, ax = fstyle.new_figure(style)
    y = ok[ycol] * (100 if percent else 1)
    if not ok.empty:
        _lines(ax, ok.assign(_y=y), "_y", styles)
        if f"{ycol}_ci_lo" in ok.columns:  # 95% CI band
            scale = 100 if percent else 1
            for s, g in ok.groupby("series"):
                ax.fill_between(g["n"], g[f"{ycol}_ci_lo"] * scale, g[f"{ycol}_ci_hi"] * scale,
                                color=palette[s], alpha=0.2, linewidth=0)
    all_n = list(d["n"])
    if ref_lines is not None:
        styles = ["-.", ":", (0, (5, 2)), (0, (1, 3))]
        for i, r in enumerate(ref_lines.itertuples(index=False)):
            ax.axhline(100 * r.fraction, color="0.3", linestyle=styles[i % len(styles)],
                       linewidth=1, label=f"{r.label}: {r.fraction:.1%} of peak ({r.basis})")
    _failed_strip(ax, failed, palette)
    _log2_axis(ax, all_n)
    top = float(np.nanmax(y)) if len(y) else 1.0
    if f"{ycol}_ci_hi" in ok.columns and ok[f"{ycol}_ci_hi"].notna().any():
        top = max(top, float(ok[f"{ycol}_ci_hi"].max()) * (100 if percent else 1))
    if ref_lines is not None and len(ref_lines):
        top = max(top, 100 * float(ref_lines["fraction"].max()))
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    ax.set_xlabel("devices N (log2)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10 if style == "default" else None)
    if _cpu(runs) and style == "default":
        fig.text(0.01, -0.02, CPU_NOTE, fontsize=7, color="0.35")
    fstyle.legend(fig, ax, style)
    cols = ["series", "mode", "model", "n", "dp", "tp", "pp", "global_batch", ycol,
            f"{ycol}_ci_lo", f"{ycol}_ci_hi", "status", "reason"]
    data = d[[c for c in cols if c in d.columns]].assign(kind="measured")
    if ref_lines is not None and len(ref_lines):
        data = pd.concat([data, ref_lines.rename(columns={"reference": "series", "fraction": ycol})
                          .assign(kind="reference")], ignore_index=True)
    return _save(fig, out_dir, name, data, style)


def throughput_figure(eff, runs, out_dir, style: str = "default") -> list[Path]:
    return _per_n_metric_figure(eff, runs, out_dir, "throughput", "tokens_per_s_per_device",
                                "tokens/s per device", "Throughput per device (median step time); band: 95% CI",
                                percent=False, style=style)


def mfu_figure(eff, runs, out_dir, references: list[str], style: str = "default") -> list[Path]:
    if eff["mfu"].notna().any():
        ref = [refs.peak_fraction_points(r) for r in references if r in refs.REFERENCES]
        ref_lines = pd.concat(ref, ignore_index=True) if ref else None
        return _per_n_metric_figure(eff, runs, out_dir, "mfu", "mfu",
                                    "MFU (% of spec peak, model FLOPs)",
                                    "Model FLOPs utilisation vs N", percent=True, ref_lines=ref_lines,
                                    style=style)
    title = "Utilisation vs measured matmul ceiling (no spec peak for this device)"
    if references:
        title += "\npublished % of spec peak not shown: different denominator"
    if eff["util_vs_measured_ceiling"].notna().any():
        return _per_n_metric_figure(eff, runs, out_dir, "mfu", "util_vs_measured_ceiling",
                                    "% of measured matmul ceiling (model FLOPs)", title, percent=True,
                                    style=style)
    return _empty(out_dir, "mfu", "no spec peak for this device and no calibration.json:\n"
                  "no utilisation to show", eff.columns, style)


def breakdown_figure(breakdown: pd.DataFrame, loss: pd.DataFrame, out_dir: Path,
           style: str = "default") -> list[Path]:
    """``figures/breakdown.png`` / ``.pdf`` / ``.csv``: a column per series; on top, each N's
    step split into its terms (ms), measured (left) beside the model (right, lighter); below,
    the efficiency lost to each term at each N > N₀, measured beside the model. The model's
    bars where the frames hold its columns (``predicted_s``, ``predicted_loss``: joined from
    ``predict/`` by :func:`_breakdown_tables`), the measured ones alone otherwise."""
    have = breakdown[breakdown["in_step"].astype(bool) & breakdown["measured_s"].notna()]
    if have.empty:
        return _empty(out_dir, "breakdown", "no measured breakdown (profile: {enabled: true})",
                      breakdown.columns, style)
    series = list(dict.fromkeys(have["series"]))
    styles = fstyle.term_styles()
    w, h = fstyle.STYLES[style]["size"]
    fig, axes = plt.subplots(2, len(series), figsize=(max(w, 3.2 * len(series)), h * 1.6),
                             squeeze=False)
    used = []
    for col, name in enumerate(series):
        top, bottom = axes[0][col], axes[1][col]
        b = breakdown[(breakdown["series"] == name) & breakdown["in_step"].astype(bool)]
        ns = sorted(b["n"].unique())
        for i, n in enumerate(ns):
            at = b[b["n"] == n].set_index("term")
            for j, (column, alpha) in enumerate((("measured_s", 1.0), ("predicted_s", MODEL_ALPHA))):
                if column not in at:
                    continue
                base = 0.0
                for term in MEASURED_TERMS:
                    v = at[column].get(term, float("nan")) * 1e3
                    if not (v > 0):
                        continue
                    top.bar(i + (j - 0.5) * 0.38, v, 0.36, bottom=base, alpha=alpha,
                            hatch=styles[term]["hatch"], color=styles[term]["color"],
                            edgecolor="white", linewidth=0.4)
                    base += v
                    used.append(term)
        top.set_xticks(range(len(ns)), [str(n) for n in ns])
        top.set_title(f"{name}: step (ms), measured" + (" | model" if "predicted_s" in b else ""), fontsize=9)
        lo = loss[loss["series"] == name]
        lns = sorted(lo["n"].unique())
        for i, n in enumerate(lns):
            at = lo[lo["n"] == n].set_index("term")
            for j, (column, alpha) in enumerate((("measured_loss", 1.0),
                                                 ("predicted_loss", MODEL_ALPHA))):
                if column not in at:
                    continue
                up = down = 0.0
                for term in MEASURED_TERMS:
                    v = at[column].get(term, float("nan"))
                    if not isinstance(v, float) or not math.isfinite(v) or v == 0:
                        continue
                    start = up if v > 0 else down
                    bottom.bar(i + (j - 0.5) * 0.38, v, 0.36, bottom=start, alpha=alpha,
                               hatch=styles[term]["hatch"], color=styles[term]["color"],
                               edgecolor="white", linewidth=0.4)
                    up, down = (up + v, down) if v > 0 else (up, down + v)
                    used.append(term)
        bottom.axhline(0, color="0.3", lw=0.6)
        bottom.set_xticks(range(len(lns)), [str(n) for n in lns])
        bottom.set_xlabel("devices N")
        bottom.set_title("efficiency lost vs N₀, measured" + (" | model" if "predicted_loss" in lo else ""), fontsize=9)
    axes[0][0].set_ylabel("ms per step")
    axes[1][0].set_ylabel("1 − E, by term")
    handles = [Patch(facecolor=styles[t]["color"], hatch=styles[t]["hatch"], edgecolor="white",
                     label=TERM_LABELS[t]) for t in MEASURED_TERMS if t in used]
    if "predicted_s" in breakdown:
        handles.append(Patch(facecolor="0.3", alpha=MODEL_ALPHA,
                             label="the model (right bar, lighter)"))
    fig.legend(handles=handles, loc="lower center", ncol=min(4, len(handles)), fontsize=7,
               frameon=False)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    return _save(fig, out_dir, "breakdown", breakdown, style)


def _study_references(study_dir: Path) -> list[str]:
    """``references`` of ``study.json`` (checked by ``record.run_records.read_study``)."""
    return list((read_study(study_dir) or {}).get("references") or [])


def _study_style(study_dir: Path) -> str:
    """``report.figure_style`` of ``study.json`` (``default`` when absent)."""
    return str(((read_study(study_dir) or {}).get("report") or {}).get("figure_style")
               or "default")


def run(study_dir: Path, references: list[str] | None = None,
        style: str | None = None) -> list[Path]:
    """Draw every figure of a study directory (after ``report.aggregate.aggregate_study``); returns the paths
    written (PNG, PDF and CSV per figure). ``references`` defaults to the study's own list,
    ``style`` to the study's ``report.figure_style``."""
    study_dir = Path(study_dir)
    eff_path, runs_path = study_dir / "efficiency.csv", study_dir / "runs.csv"
    for p in (eff_path, runs_path):
        if not p.exists():
            raise FileNotFoundError(f"{p} not found: run `scalestudy aggregate {study_dir}` first")
    eff = pd.read_csv(eff_path)
    runs = pd.read_csv(runs_path)
    refs_named = _study_references(study_dir) if references is None else list(references)
    for r in refs_named:
        refs._check(r, refs.REFERENCES)
    style = fstyle.checked(style or _study_style(study_dir))
    refuse_escaping_links(study_dir)  # a figures/ linked elsewhere is not written through
    out_dir = study_dir / "figures"
    sns.set_theme(style="whitegrid", context="paper")
    paths: list[Path] = []
    with tables_lock(study_dir), fstyle.applied(style):  # one writer of the figures at a time
        out_dir.mkdir(parents=True, exist_ok=True)
        clean_temps(out_dir, FIGURES)  # a killed plot's leftovers
        for mode in ("weak", "strong"):
            paths += efficiency_figure(eff, runs, mode, out_dir, refs_named, style)
        paths += throughput_figure(eff, runs, out_dir, style)
        paths += mfu_figure(eff, runs, out_dir, refs_named, style)
        paths += breakdown_figure(*_breakdown_tables(study_dir), out_dir, style)
    return paths


def _breakdown_tables(study_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``breakdown.csv`` and ``efficiency_loss.csv`` (empty tables where aggregate wrote
    none), the model's ``predicted_s`` / ``predicted_loss`` joined where ``scalestudy
    predict`` wrote them (``report.breakdown.model_side``)."""
    out = []
    for name, cols in (("breakdown.csv", BREAKDOWN_COLUMNS), ("efficiency_loss.csv",
                                                             LOSS_COLUMNS)):
        path = study_dir / name
        out.append(pd.read_csv(path) if path.exists() else pd.DataFrame(columns=cols))
    model_brk, model_loss = model_side(study_dir)
    return (joined(out[0], model_brk, "predicted_s"),
            joined(out[1], model_loss, "predicted_loss"))
