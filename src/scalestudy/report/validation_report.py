"""The step model against the published tables, as a report (``scalestudy predict
--validate``): per table MAPE, bias, coverage and range width, every published series
anchored at its smallest N, every row with its range, and a figure of them
(``validation.published`` computes; this module writes)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from scalestudy.validation import published as validation
from scalestudy.validation import series
from scalestudy.validation.memory_layouts import HEADROOM, memory_rows
from scalestudy.perf.hardware import fitted
from scalestudy.record.io import write_csv, write_text
from scalestudy.report import style as fstyle


def write(out: Path) -> str:
    """Validate every shipped table and write ``validation.csv``, ``validation_summary.csv``,
    ``validation_series.csv``, ``validation_memory.csv``, ``validation.md`` and
    ``validation.png`` in ``out``; returns the markdown."""
    rows = validation.validate()
    summary = validation.summary(rows)
    anchored = series.series_table()
    write_csv(rows, out / "validation.csv")
    write_csv(summary, out / "validation_summary.csv")
    write_csv(anchored, out / "validation_series.csv")
    mem = pd.DataFrame(memory_rows())
    write_csv(mem, out / "validation_memory.csv")
    md = validation_markdown(rows, summary, fitted(), anchored) + memory_markdown(mem)
    write_text(out / "validation.md", md)
    validation_figure(rows, out / "validation.png")
    return md


def validation_markdown(rows, summary, fit: dict, anchored=None) -> str:
    """The validation report: the fitted constants; per table MAPE and bias of the central
    values, coverage (published inside the predicted range) and the range's median width,
    the worst row, the leave-one-table-out figures; every published series' efficiency at
    its largest N anchored at its smallest; then every modelled row (its range and the
    fields the table leaves unsaid) and every row left out with its reason."""
    consts = fit.get("constants") or {}
    info = fit.get("fit") or {}
    loto = info.get("per_table") or {}
    lines = ["# The step model against published training throughput", "",
             f"Fitted constants: {len(consts)} "
             + (", ".join(f"`{k}` = {v['value']} (range {v['low']}–{v['high']})"
                          for k, v in consts.items()) or "(none)")
             + (f", fitted on {', '.join(info.get('tables', []))}" if info else "")
             + ". Every other table is out of sample; the leave-one-table-out columns refit the "
             "constant without the table itself. A row's range spans every reading of what its "
             "table leaves unsaid and every stated assumption (docs/performance-model.md).", "",
             "| table | in fit | rows | left out | MAPE | bias | coverage | median width "
             "| worst row | its error | LOTO MAPE | LOTO bias |",
             "|---|:---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in summary.itertuples():
        if not r.rows:
            lines.append(f"| {r.table} | | 0 | {r.skipped} | | | | | (FLOPs not countable) "
                         "| | | |")
            continue
        lo = loto.get(r.table, {})
        lines.append(f"| {r.table} | {'yes' if r.table in info.get('tables', []) else 'no'} | "
                     f"{r.rows} | {r.skipped} | {r.mape:.1%} | {r.bias:+.1%} | "
                     f"{r.coverage:.0%} | {r.median_width:.0%} | {r.worst_row} | "
                     f"{r.worst_error:+.1%} | "
                     + (f"{lo['loto_mape']:.1%} | {lo['loto_bias']:+.1%} |" if lo else " | |"))
    if anchored is not None and not anchored.empty:
        lines += ["", "## Scaling series anchored at their smallest N", "",
                  "The software rate is solved so that the model gives the smallest N's "
                  "published figure; the model then predicts the efficiency at the largest N.",
                  "", "| table | series | scaling | N0 → N | published | predicted (band) "
                  "| error (points) |", "|---|---|---|---|---:|---:|---:|"]
        for r in anchored.itertuples():
            lines.append(f"| {r.table} | {r.series} | {r.scaling} | {r.n0} → {r.n} | "
                         f"{r.published_efficiency:.1%} | {r.predicted_efficiency:.1%} "
                         f"({r.predicted_low:.1%}–{r.predicted_high:.1%}) | "
                         f"{r.error_points:+.1f} |")
    ok = rows[rows["skip"] == ""]
    lines += ["", "## Every modelled row", "",
              "| table | row | metric | published | predicted (range) | error | unsaid |",
              "|---|---|---|---:|---:|---:|---|"]
    for r in ok.itertuples():
        lines.append(f"| {r.table} | {r.row} | {r.metric} | {r.published:.4g} | {r.predicted:.4g} "
                     f"({r.predicted_low:.4g}–{r.predicted_high:.4g}) | {r.error:+.1%} | "
                     f"{r.ranged} |")
    skipped = rows[rows["skip"] != ""]
    if not skipped.empty:
        lines += ["", "## Rows left out", "", "| table | row | metric | why |",
                  "|---|---|---|---|"]
        for r in skipped.itertuples():
            lines.append(f"| {r.table} | {r.row} | {r.metric} | {r.skip} |")
    return "\n".join(lines) + "\n"


def memory_markdown(mem) -> str:
    """The memory model against published layouts: per layout the estimate of its most
    loaded device, the device's memory, the model's verdict and what the source reports."""
    lines = ["", "## The memory model against published layouts", "",
             f"A layout fits when the estimate of its most loaded device is within "
             f"{HEADROOM:.0%} of the device's memory; `ran` is what its source reports.", "",
             "| layout | N | tp × pp × dp × cp | estimate | device | fits | ran | agrees |",
             "|---|---:|---|---:|---:|:---:|:---:|:---:|"]
    for r in mem.itertuples():
        lines.append(f"| {r.layout} | {r.n} | {r.tp} × {r.pp} × {r.dp} × {r.cp} | "
                     f"{r.estimate_bytes / 2**30:.1f} GiB | {r.memory_bytes / 2**30:.1f} GiB | "
                     f"{'yes' if r.fits else 'no'} | {'yes' if r.ran else 'no'} | "
                     f"{'yes' if r.agrees else '**no**'} |")
    return "\n".join(lines) + "\n"


def validation_figure(rows, path: Path, style: str = "default") -> Path:
    """Predicted against published, one marker per modelled row (the central value) with its
    range as a bar, one colour and marker per table, every metric as its ratio to the
    published value (log scale), the ±10% and ±20% bands shaded."""
    ok = rows[rows["skip"] == ""].reset_index(drop=True)
    st = fstyle.series_styles(sorted(ok["table"].unique()))
    with fstyle.applied(style):
        fig, ax = fstyle.new_figure(style)
        ax.axhspan(0.8, 1.2, color="0.92", zorder=0, label="±20%")
        ax.axhspan(0.9, 1.1, color="0.82", zorder=0, label="±10%")
        ax.axhline(1.0, color="black", lw=0.8)
        for table, g in ok.groupby("table"):
            s = st[table]
            ax.scatter(g.index, 1.0 + g["error"], color=s["color"], marker=s["marker"], s=18,
                       label=table, zorder=3)
            lo, hi = (g["predicted_low"] / g["published"], g["predicted_high"] / g["published"])
            flip = g["metric"] == "iteration_s"  # a longer step is pessimism
            lo, hi = lo.where(~flip, 1 / hi), hi.where(~flip, 1 / lo)
            ax.vlines(g.index, lo, hi, color=s["color"], lw=0.8, alpha=0.6, zorder=2)
        ax.set_yscale("log")
        ticks = [0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 2.0]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
        ax.set_ylabel("predicted / published (optimism > 1)")
        ax.set_xlabel("published row")
        ax.set_title("Step model vs published tables")
        fstyle.legend(fig, ax, style)
    return fstyle.save(fig, path, style)[0]
