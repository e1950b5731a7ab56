"""``summary.md``: the headline table a person pastes into a paper, with the notes that make
its numbers readable (FLOPs convention, peak, statistics, failed points, where the efficiency
went); and the study's tables written together with it (``runs.csv``, ``runs.parquet``,
``efficiency.csv``, ``breakdown.csv``, ``efficiency_loss.csv``, ``summary.md``,
``summary.tex``: :func:`scalestudy.report.aggregate.aggregate_study`).

    scalestudy aggregate RESULTS/STUDY
"""

from __future__ import annotations

import re
from collections import namedtuple

import pandas as pd

from scalestudy.number_format import finite, fmt, interval, percent
from scalestudy.report.breakdown import markdown as breakdown_markdown
from scalestudy.report.tune import tune_markdown

CPU_NOTE = ("CPU/gloo runs test correctness and communication volume, not cluster "
            "communication time.")

FORMULAS = {
    "megatron": "Megatron-LM SC21 Eq. 3, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per step for a "
                "GELU 4h MLP (generalised: 6 FLOPs per matmul weight per token + 12·l·h·s attention "
                "+ output head)",
    "palm": "PaLM App. B, 6·N + 12·l·H·Q·s per token, N = non-embedding matmul weights",
}


HEADLINE_SOURCE = ["series", "mode", "n", "dp", "tp", "pp", "global_batch", "tokens_per_step",
                   "step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s",
                   "tokens_per_s_per_device", "efficiency", "efficiency_ci_lo",
                   "efficiency_ci_hi", "speedup", "status", "n_ok", "n_repeats"]


def utilisation_column(efficiency: pd.DataFrame) -> tuple[str, str]:
    """(column, name) of the utilisation the headline shows: MFU when any point has a spec
    peak, else utilisation vs the measured matmul ceiling."""
    use_mfu = efficiency["mfu"].notna().any() if len(efficiency) else False
    return ("mfu", "MFU") if use_mfu else ("util_vs_measured_ceiling",
                                           "util. vs measured matmul ceiling")


def headline_cells(efficiency: pd.DataFrame) -> tuple[list[str], list[list[str]], str]:
    """The headline table as text cells: (header, rows, utilisation name). One row per
    series and N; the same cells make ``summary.md`` and the report's front page."""
    util_col, util_name = utilisation_column(efficiency)
    head = ["series", "mode", "N", "DP×TP×PP", "global batch", "tokens/step",
            "step time ms [95% CI]", "tokens/s/device", "efficiency [95% CI]", "speedup",
            util_name, "status"]
    rows = []
    for r in _rows(efficiency, HEADLINE_SOURCE + [util_col]):
        rows.append([
            str(r.series), str(r.mode), str(r.n), f"{r.dp}×{r.tp}×{r.pp}", fmt(r.global_batch, "g"),
            fmt(r.tokens_per_step, "g"),
            interval(r.step_time_s, r.step_time_ci_lo_s, r.step_time_ci_hi_s, ".4g", 1e3),
            fmt(r.tokens_per_s_per_device, ".4g"),
            interval(r.efficiency, r.efficiency_ci_lo, r.efficiency_ci_hi, ".3f"),
            fmt(r.speedup, ".3g"), percent(r[-1]),
            str(r.status) + (f" ({r.n_ok}/{r.n_repeats} repeats)" if r.n_ok not in (r.n_repeats, 0) else ""),
        ])
    return head, rows, util_name


#: What can turn text into Markdown or HTML markup: backslash-escaped (CommonMark renders an
#: escaped punctuation mark as itself); ``>`` and ``_`` mid-line are plain text and stay as
#: they are, and ``&`` is escaped only where an entity could start.
_MD_SPECIAL = re.compile(r"[\\`*\[\]<|]|&(?=[#A-Za-z])")


def md_text(text) -> str:
    """``text`` safe inside a Markdown table cell or list item: one line, and every character
    that could start markup (a tag, a link, emphasis, code, an entity, a table cell)
    backslash-escaped: a host name or log line never becomes markup, and reads as itself."""
    t = str(text).replace("\r", " ").replace("\n", " ")
    return _MD_SPECIAL.sub(lambda m: "\\" + m.group(0), t)


def headline_table(runs: pd.DataFrame, efficiency: pd.DataFrame) -> tuple[str, str]:
    """Markdown table (one row per series and N) and the name of the utilisation column."""
    head, rows, util_name = headline_cells(efficiency)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for cells in rows:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines), util_name


def findings(efficiency: pd.DataFrame) -> list[dict]:
    """Per series, the answer in one line: the efficiency (with its CI) and the throughput
    per device at the largest N that has a curve value, and the largest N that did not run.
    Each: ``{series, mode, n, baseline_n, text}``."""
    out = []
    for series, g in efficiency.groupby("series", sort=False):
        g = g.sort_values("n")
        mode = str(g["mode"].iloc[0])
        ok = g[g["efficiency"].notna()]
        bad = g[g["status"] != "ok"]
        what = "tokens per device per step fixed" if mode == "weak" else "tokens per step fixed"
        if ok.empty:
            note = str(g["note"].dropna().iloc[0]) if g["note"].notna().any() else ""
            text = f"no efficiency curve{': ' + note if note else ''}"
            out.append({"series": series, "mode": mode, "n": None, "baseline_n": None,
                        "text": text})
            continue
        r = ok.iloc[-1]
        text = (f"efficiency {interval(r.efficiency, r.efficiency_ci_lo, r.efficiency_ci_hi, '.3f')}"
                f" at N={int(r.n)} vs N₀={fmt(r.baseline_n, 'g')}, "
                f"{fmt(r.tokens_per_s_per_device, '.4g')} tokens/s per device")
        worse = bad[bad["n"] > r.n]
        if len(worse):
            w = worse.iloc[0]
            text += f"; N={int(w.n)}: {w.status}"
        out.append({"series": series, "mode": mode, "n": int(r.n),
                    "baseline_n": r.baseline_n, "text": f"{mode} scaling ({what}): {text}"})
    return out


def _rows(df: pd.DataFrame, cols: list[str]):
    """``df[cols].itertuples(index=False)`` (same values), from each column's ``tolist()``:
    iterating text columns value by value is slow."""
    row = namedtuple("Row", cols, rename=True)
    return map(row._make, zip(*(df[c].tolist() for c in cols)))


def summary_markdown(runs: pd.DataFrame, efficiency: pd.DataFrame, context: dict) -> str:
    """The text of ``summary.md``; with the layout search's "## Tuning" section when
    ``context["trials"]`` holds its record (``tune/trials.csv``, :func:`scalestudy.report.aggregate.aggregate_study`)."""
    study = context.get("study") or {}
    name = study.get("name") or (runs["study"].dropna().iloc[0] if runs["study"].notna().any() else "study")
    table, util_name = headline_table(runs, efficiency)
    conv = context.get("convention", "megatron")
    out = [f"# Scaling study `{name}`", ""]
    if study.get("description"):
        out += [str(study["description"]), ""]
    n_ok = int((runs["status"] == "ok").sum())
    out += [f"{len(runs)} planned runs, {n_ok} ok. Efficiency E(N) = X(N)/X(N0) with X = tokens "
            "per step / (step time × N); speedup = T(N0)/T(N).", "", table, "", "## Notes", ""]

    out.append(f"- FLOPs convention: `{conv}` — {FORMULAS.get(conv, conv)}. MFU counts model "
               "FLOPs (no recompute); HFU (in runs.csv) adds activation-checkpointing recompute.")
    ok = runs[runs["status"] == "ok"]
    peaks = ok.dropna(subset=["peak_tflops"]).drop_duplicates(["hardware", "peak_tflops"])
    for r in peaks.itertuples(index=False):
        out.append(f"- Peak: {r.hardware} {r.peak_tflops:g} TFLOPS dense {r.precision} per device "
                   f"({r.peak_source}).")
    if peaks.empty:
        devs = ", ".join(sorted({str(d) for d in ok["device_name"].dropna()})) or "this device"
        out.append(f"- No spec peak for {devs} at this precision: MFU is left empty (never a guess).")
    cal = context.get("calibration")
    if cal and finite(cal.get("flops_per_s")) is not None:
        out.append(f"- Measured matmul ceiling (calibration.json, labelled as such): "
                   f"{float(cal['flops_per_s']) / 1e12:.4g} TFLOPS per device ({cal.get('device_name')}, "
                   f"{cal.get('dtype')}, {cal.get('m')}³ matmul, median of "
                   f"{len(cal.get('samples_flops_per_s', []))}); `{util_name if util_name != 'MFU' else 'util_vs_measured_ceiling'}` "
                   "= model FLOPs/s per device ÷ that ceiling.")
    reps = int(runs["repeat"].max()) + 1 if runs["repeat"].notna().any() else 1
    out.append(f"- Step time: median over steady-state steps (declared warm-up dropped); 95% CI "
               f"by bootstrap of the median{' (hierarchical: repeats, then steps)' if reps > 1 else ''}; "
               f"{reps} repeat(s) per point. Efficiency CI: bootstrap of the ratio.")
    if (ok["device_type"] == "cpu").any() or (runs["device_type"] == "cpu").any():
        out.append(f"- {CPU_NOTE}")
    out.append(f"- {energy_note(runs)}")
    for msg in context.get("messages", []):
        out.append(f"- **{msg}**")
    notes = efficiency[efficiency["note"].fillna("") != ""].drop_duplicates(["series", "note"])
    for r in notes.itertuples(index=False):
        if not any(str(r.series) in m for m in context.get("messages", [])):
            out.append(f"- series `{r.series}`: {r.note}")
    bad = runs[runs["status"] != "ok"]
    if len(bad):
        out += ["", "## Points that did not run successfully", ""]
        for r in _rows(bad, ["point_id", "status", "reason"]):
            out.append(f"- `{r.point_id}`: {r.status} — {md_text(r.reason)}")
    flagged = straggler_runs(runs)
    if len(flagged):
        out += ["", "## Points shaped by a straggler (ok, flagged)", ""]
        for r in _rows(flagged, ["point_id", "straggler_note"]):
            out.append(f"- `{r.point_id}`: {md_text(r.straggler_note)}")
    if context.get("loss") is not None:
        out += breakdown_markdown(context["loss"], context["breakdown"],
                                  context.get("model_loss"))
    if context.get("trials") is not None:  # a layout search's record (tune/trials.csv)
        out += ["", tune_markdown(context["trials"], name, context.get("best_study")).rstrip()]
    return "\n".join(out) + "\n"


def straggler_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The ok runs flagged as shaped by a straggler (``runs.csv``'s ``straggler_note``,
    ``scalestudy.record.stragglers``); none for a table without the column."""
    if "straggler_note" not in runs.columns:
        return runs.iloc[0:0]
    notes = runs["straggler_note"]
    return runs[(runs["status"] == "ok") & notes.notna() & (notes.astype(str) != "")]


def energy_note(runs: pd.DataFrame) -> str:
    """What the energy columns of ``runs.csv`` hold, or why they are empty."""
    if "joules_per_token" not in runs.columns:
        return "Energy: not recorded."
    ok = runs[runs["status"] == "ok"]
    have = ok[ok["joules_per_token"].notna()]
    if len(have):
        sources = ", ".join(sorted({str(s) for s in have["energy_source"].dropna()}))
        notes = "; ".join(sorted({str(s) for s in have["energy_note"].dropna() if str(s)}))
        return (f"Energy ({sources}): `joules_per_token` = energy of all ranks over the "
                "steady-state steps ÷ their tokens; `avg_power_w` = that energy ÷ the time it "
                f"covers, summed over ranks. {len(have)} of {len(ok)} ok run(s) measured"
                + (f"; {notes}" if notes else "") + ".")
    reasons = sorted({str(s) for s in ok["energy_note"].dropna() if str(s)}) if len(ok) else []
    why = "; ".join(reasons) or "no run recorded an energy counter"
    return f"Energy: `joules_per_token` and `avg_power_w` are empty (never a guess): {why}."


# --- LaTeX -------------------------------------------------------------------------------------

_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                "^": r"\textasciicircum{}"}


def tex_escape(text) -> str:
    """``text`` with LaTeX's special characters escaped."""
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(text))


def _tex_num(v: float, spec: str) -> str:
    return format(float(v), spec)


def tex_ci(v, lo, hi, spec: str = ".3f", scale: float = 1.0) -> str:
    """A value with its 95% CI as ``$v \\pm e$`` (a symmetric interval at the printed precision)
    or ``$v^{+a}_{-b}$`` (an asymmetric one); ``--`` when there is no value."""
    if finite(v) is None:
        return "--"
    x = float(v) * scale
    if finite(lo) is None or finite(hi) is None:
        return f"${_tex_num(x, spec)}$"
    up, down = float(hi) * scale - x, x - float(lo) * scale
    a, b = _tex_num(max(up, 0.0), spec), _tex_num(max(down, 0.0), spec)
    if a == b:
        return f"${_tex_num(x, spec)} \\pm {a}$"
    return f"${_tex_num(x, spec)}^{{+{a}}}_{{-{b}}}$"


def summary_latex(runs: pd.DataFrame, efficiency: pd.DataFrame, context: dict) -> str:
    """``summary.tex``: the headline table as a LaTeX ``table`` with booktabs rules, units in
    the headers and each 95% CI as ``±`` (needs ``\\usepackage{booktabs}``)."""
    study = context.get("study") or {}
    name = study.get("name") or (runs["study"].dropna().iloc[0] if runs["study"].notna().any() else "study")
    util_col, util_name = utilisation_column(efficiency)
    util_head = "MFU (\\%)" if util_col == "mfu" else "util.\\ vs matmul ceiling (\\%)"
    head = ["Series", "Mode", "$N$", "DP$\\times$TP$\\times$PP", "Global batch (seq.)",
            "Tokens/step", "Step time (ms)", "Throughput (tokens/s/device)", "Efficiency",
            "Speedup", util_head]
    lines = [
        f"% summary.tex of scaling study {tex_escape(name)} (scalestudy); needs \\usepackage{{booktabs}}",
        "\\begin{table}[t]",
        "\\centering",
        "\\small",
        "\\begin{tabular}{ll" + "r" * (len(head) - 2) + "}",
        "\\toprule",
        " & ".join(head) + " \\\\",
        "\\midrule",
    ]
    previous = None
    for r in _rows(efficiency, HEADLINE_SOURCE + [util_col]):
        if previous is not None and r.series != previous:
            lines.append("\\addlinespace")
        previous = r.series
        status = "" if r.status == "ok" else f" ({tex_escape(r.status)})"
        util = r[-1]
        cells = [
            tex_escape(r.series), tex_escape(r.mode), str(r.n), f"{r.dp}$\\times${r.tp}$\\times${r.pp}",
            fmt(r.global_batch, "g"), fmt(r.tokens_per_step, "g"),
            tex_ci(r.step_time_s, r.step_time_ci_lo_s, r.step_time_ci_hi_s, ".2f", 1e3) + status,
            fmt(r.tokens_per_s_per_device, ".0f").replace("–", "--"),
            tex_ci(r.efficiency, r.efficiency_ci_lo, r.efficiency_ci_hi, ".3f"),
            fmt(r.speedup, ".2f").replace("–", "--"),
            fmt(util, ".1f", 100).replace("–", "--"),
        ]
        lines.append(" & ".join(cells) + " \\\\")
    conv = context.get("convention", "megatron")
    lines += [
        "\\bottomrule",
        "\\end{tabular}",
        f"\\caption{{Scaling study \\texttt{{{tex_escape(name)}}}: median steady-state step time and "
        "efficiency $E(N) = X(N)/X(N_0)$, $X$ = tokens per step / (step time $\\times N$), each "
        "$\\pm$ its bootstrap 95\\% confidence interval (asymmetric intervals as "
        "$^{+a}_{-b}$); speedup $T(N_0)/T(N)$; "
        + (f"MFU in the {tex_escape(conv)} FLOPs convention." if util_col == "mfu" else
           "utilisation against the measured matmul ceiling (no spec peak for this device).")
        + "}",
        f"\\label{{tab:scaling-{tex_escape(name).replace(chr(92) + '_', '-')}}}",
        "\\end{table}",
    ]
    return "\n".join(lines) + "\n"
