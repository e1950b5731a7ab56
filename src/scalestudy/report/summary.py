"""``summary.md``: the headline table a person pastes into a paper, with the notes that make
its numbers readable (FLOPs convention, peak, statistics, failed points)."""

from __future__ import annotations

import math
from collections import namedtuple

import pandas as pd

CPU_NOTE = ("CPU/gloo runs test correctness and communication volume, not cluster "
            "communication time.")

FORMULAS = {
    "megatron": "Megatron-LM SC21 Eq. 3, 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) per step for a "
                "GELU 4h MLP (generalised: 6 FLOPs per matmul weight per token + 12·l·h·s attention "
                "+ output head)",
    "palm": "PaLM App. B, 6·N + 12·l·H·Q·s per token, N = non-embedding matmul weights",
}


def _isnum(x) -> bool:
    try:
        return x is not None and math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _fmt(x, spec: str = ".3g", scale: float = 1.0) -> str:
    return format(float(x) * scale, spec) if _isnum(x) else "–"


def _ci(v, lo, hi, spec: str = ".3g", scale: float = 1.0) -> str:
    if not _isnum(v):
        return "–"
    if _isnum(lo) and _isnum(hi):
        return f"{_fmt(v, spec, scale)} [{_fmt(lo, spec, scale)}, {_fmt(hi, spec, scale)}]"
    return _fmt(v, spec, scale)


def _pct(x) -> str:
    return f"{100 * float(x):.1f}%" if _isnum(x) else "–"


def headline_table(runs: pd.DataFrame, efficiency: pd.DataFrame) -> tuple[str, str]:
    """Markdown table (one row per series and N) and the name of the utilisation column."""
    use_mfu = efficiency["mfu"].notna().any() if len(efficiency) else False
    util_col, util_name = ("mfu", "MFU") if use_mfu else (
        "util_vs_measured_ceiling", "util. vs measured matmul ceiling")
    head = ["series", "mode", "N", "DP×TP×PP", "global batch", "tokens/step",
            "step time ms [95% CI]", "tokens/s/device", "efficiency [95% CI]", "speedup",
            util_name, "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in _rows(efficiency, ["series", "mode", "n", "dp", "tp", "pp", "global_batch",
                                "tokens_per_step", "step_time_s", "step_time_ci_lo_s",
                                "step_time_ci_hi_s", "tokens_per_s_per_device", "efficiency",
                                "efficiency_ci_lo", "efficiency_ci_hi", "speedup", util_col,
                                "status", "n_ok", "n_repeats"]):
        cells = [
            str(r.series), str(r.mode), str(r.n), f"{r.dp}×{r.tp}×{r.pp}", _fmt(r.global_batch, "g"),
            _fmt(r.tokens_per_step, "g"),
            _ci(r.step_time_s, r.step_time_ci_lo_s, r.step_time_ci_hi_s, ".4g", 1e3),
            _fmt(r.tokens_per_s_per_device, ".4g"),
            _ci(r.efficiency, r.efficiency_ci_lo, r.efficiency_ci_hi, ".3f"),
            _fmt(r.speedup, ".3g"), _pct(getattr(r, util_col)),
            str(r.status) + (f" ({r.n_ok}/{r.n_repeats} repeats)" if r.n_ok not in (r.n_repeats, 0) else ""),
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines), util_name


def _rows(df: pd.DataFrame, cols: list[str]):
    """``df[cols].itertuples(index=False)`` (same values), from each column's ``tolist()``:
    iterating text columns value by value is slow."""
    row = namedtuple("Row", cols, rename=True)
    return map(row._make, zip(*(df[c].tolist() for c in cols)))


def summary_markdown(runs: pd.DataFrame, efficiency: pd.DataFrame, context: dict) -> str:
    """The text of ``summary.md``."""
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
    if cal and _isnum(cal.get("flops_per_s")):
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
            out.append(f"- `{r.point_id}`: {r.status} — {r.reason}")
    return "\n".join(out) + "\n"
