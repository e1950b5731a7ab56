"""``scalestudy compare``: the same series of several studies on one set of axes, with per-point
ratios and their confidence intervals.

    scalestudy compare RESULTS_A RESULTS_B [...] --out DIR [--style S]

Each argument is a study's results folder (``results/<study>``; the records are re-aggregated,
so a folder needs its ``plan.tsv`` and ``runs/``). The first study is the baseline. A series is
compared when the studies share its name; its definition must agree: the scaling **mode**, the
**model** (name and every shape field of ``point.json``) and the **invariant** (tokens per
device per step for weak scaling, tokens per step for strong). Otherwise the comparison is
refused with one line naming the series and the field (exit status 2): different experiments
are not put on one axis. Settings that may differ (parallel layout, ``dp_mode``, precision:
a tuning change) are named per point in the table's ``differs`` column.

Studies are labelled by their name (their folder's path when names repeat) and by the
environment fields of ``env.json`` that differ between them: hosts, device, torch, CUDA/ROCm,
NCCL, Slurm partition, git commit.

Writes ``DIR/compare.csv`` (per point of each study against the baseline: step times,
throughput per device, efficiency and utilisation of both, the ratios study/baseline with
bootstrap 95% CIs), ``compare.md`` (printed too) and ``compare_efficiency``,
``compare_throughput``, ``compare_mfu`` (``.png``, ``.pdf``, ``.csv``: colour = series, marker
and line style = study). Ratio CIs: the bootstrap distributions of the median step time of
each point (hierarchical over repeats, seeded per study, so the studies' draws are
independent) are combined into throughput ratio X_B/X_A and efficiency ratio E_B/E_A
(E = X(N)/X(N₀), each study against its own N₀); the utilisation ratio is the throughput ratio
times the ratio of FLOPs per token over the peaks (constants).
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy.analysis import stats
from scalestudy.record.run_records import read_env, read_point
from scalestudy.report.summary import md_text

#: Fields of the model that define it (``point.json``'s ``model``).
MODEL_FIELDS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "mlp",
                "attention", "tied_embeddings", "bias")
#: Per-point settings a comparison may change (named in ``differs``).
SETTINGS = ("dp", "tp", "pp", "micro_batch", "grad_accum", "global_batch", "dp_mode",
            "pp_schedule", "activation_checkpointing", "precision")
#: env.json fields that label a study when they differ.
ENV_FIELDS = ("hosts", "device_name", "torch", "cuda", "rocm", "nccl", "partition", "git_commit")


class CompareError(ValueError):
    """Studies that cannot be compared (one line: what differs)."""


@dataclass
class StudyResults:
    """A run study as the comparison reads it: its tables, models, environment, bootstraps."""

    path: Path
    name: str
    runs: pd.DataFrame
    eff: pd.DataFrame
    models: dict  # series -> model definition
    env: dict
    boots: dict = field(default_factory=dict)  # (series, n) -> bootstrap medians of step time
    label: str = ""


def _mode_value(values) -> str:
    vals = [str(v) for v in values if v not in (None, "", [])]
    if not vals:
        return ""
    common = Counter(vals).most_common()
    return common[0][0] if len(common) == 1 else "/".join(sorted(set(vals)))


def load_results(path: Path, index: int) -> StudyResults:
    """Aggregate a study folder afresh and read what the comparison needs."""
    from scalestudy.analysis import aggregate

    path = Path(path)
    if not (path / "plan.tsv").is_file():
        raise CompareError(f"{path}: not a study's results folder (no plan.tsv)")
    runs, eff, ctx = aggregate.collect(path)
    name = str(((ctx.get("study") or {}).get("name")) or path.name)
    models, envs = {}, []
    boots: dict = {}
    for (series, n), g in runs.groupby(["series", "n"], sort=False):
        groups = []
        for r in g.itertuples(index=False):
            d = path / "runs" / str(r.point_id)
            if series not in models:
                point = read_point(d, str(r.point_id))[0] or {}
                if point.get("model"):
                    models[series] = {k: point["model"].get(k) for k in ("name",) + MODEL_FIELDS}
            if r.status != "ok":
                continue
            t = ctx["times"].get(str(r.point_id)) or []  # read and checked by aggregate
            if t:
                groups.append(t)
            env = read_env(d)[0]  # a damaged env.json labels nothing
            if env:
                envs.append(env)
        if groups:
            seed = stats.SEED + zlib.crc32(f"compare|{index}|{series}|{int(n)}".encode())
            boots[(series, int(n))] = stats.bootstrap_medians(groups, seed=seed)
    env = {
        "hosts": _mode_value(",".join(e.get("hosts") or []) for e in envs),
        "device_name": _mode_value(e.get("device_name") for e in envs),
        "torch": _mode_value(e.get("torch") for e in envs),
        "cuda": _mode_value(e.get("cuda") for e in envs),
        "rocm": _mode_value(e.get("rocm") for e in envs),
        "nccl": _mode_value(e.get("nccl") for e in envs),
        "partition": _mode_value((e.get("slurm") or {}).get("SLURM_JOB_PARTITION") for e in envs),
        "git_commit": _mode_value((e.get("git_commit") or "")[:10] for e in envs),
    }
    return StudyResults(path, name, runs, eff, models, env, boots)


# --- definitions -----------------------------------------------------------------------------


def _invariant(runs: pd.DataFrame, mode: str) -> tuple[str, str]:
    col = "tokens_per_device_step" if mode == "weak" else "tokens_per_step"
    what = "tokens per device per step" if mode == "weak" else "tokens per step"
    vals = sorted({float(v) for v in runs[col].dropna()})
    return what, "/".join(f"{v:g}" for v in vals)


def definition(study: StudyResults, series: str) -> dict:
    """What defines a series: mode, model, invariant."""
    g = study.runs[study.runs["series"] == series]
    mode = _mode_value(g["mode"])
    what, inv = _invariant(g, mode)
    model = study.models.get(series) or {"name": _mode_value(g["model"])}
    return {"mode": mode, "model": model, "invariant": (what, inv)}


def check_definitions(studies: list[StudyResults]) -> list[str]:
    """The series at least two studies share; raise ``CompareError`` (one line) for the first
    of them whose mode, model or invariant differs between the studies that have it."""
    names = [list(dict.fromkeys(s.runs["series"])) for s in studies]
    shared = [x for x in names[0] if sum(x in n for n in names) >= 2]
    for n in names[1:]:
        shared += [x for x in n if x not in shared and sum(x in m for m in names) >= 2]
    if not shared:
        raise CompareError("no series in common: " + "; ".join(
            f"{s.label}: {', '.join(n)}" for s, n in zip(studies, names)))
    for series in shared:
        defs = [(s, definition(s, series)) for s in studies if series in set(s.runs["series"])]
        s0, d0 = defs[0]
        for s, d in defs[1:]:
            if d["mode"] != d0["mode"]:
                raise CompareError(f"series {series!r}: mode differs ({s0.label}: {d0['mode']}, "
                                   f"{s.label}: {d['mode']}); only the same experiment is compared")
            m0, m = d0["model"], d["model"]
            for k in ("name",) + MODEL_FIELDS:
                if k in m0 and k in m and m0[k] != m[k]:
                    raise CompareError(f"series {series!r}: model.{k} differs ({s0.label}: "
                                       f"{m0[k]}, {s.label}: {m[k]}); only the same model is compared")
            if d["invariant"] != d0["invariant"]:
                raise CompareError(f"series {series!r}: invariant ({d0['invariant'][0]}) differs "
                                   f"({s0.label}: {d0['invariant'][1]}, {s.label}: "
                                   f"{d['invariant'][1]}); only the same experiment is compared")
    return shared


def label(studies: list[StudyResults]) -> list[str]:
    """Each study's label: name (path when names repeat) + the env fields that differ."""
    names = [s.name for s in studies]
    dup = len(set(names)) < len(names)
    base = []
    for s in studies:
        if dup:
            parts = s.path.resolve().parts
            base.append("/".join(parts[-2:]) if len(parts) >= 2 else str(s.path))
        else:
            base.append(s.name)
    if len(set(base)) < len(base):
        base = [str(s.path) for s in studies]
    differing = [k for k in ENV_FIELDS if len({s.env.get(k, "") for s in studies}) > 1]
    out = []
    for b, s in zip(base, studies):
        extra = ", ".join(f"{k}={s.env.get(k) or '-'}" for k in differing)
        out.append(f"{b} ({extra})" if extra else b)
    for s, lab in zip(studies, out):
        s.label = lab
    return differing


# --- ratios ----------------------------------------------------------------------------------


def _ci(dist: np.ndarray) -> tuple[float, float]:
    d = dist[np.isfinite(dist)]
    if not len(d):
        return float("nan"), float("nan")
    return stats.percentile_ci(d)


def _util_column(studies: list[StudyResults]) -> tuple[str, str]:
    if all(s.eff["mfu"].notna().any() for s in studies):
        return "mfu", "MFU"
    return "util_vs_measured_ceiling", "util. vs measured matmul ceiling"


def ratios(studies: list[StudyResults], shared: list[str]) -> pd.DataFrame:
    """Per point of each study (after the first) against the first (module doc)."""
    a = studies[0]
    util_col, util_name = _util_column(studies)
    rows = []
    ea = a.eff.set_index(["series", "n"])
    for b in studies[1:]:
        eb = b.eff.set_index(["series", "n"])
        for series in shared:
            if series not in set(a.eff["series"]) or series not in set(b.eff["series"]):
                continue
            ns = sorted(set(a.eff.loc[a.eff["series"] == series, "n"])
                        | set(b.eff.loc[b.eff["series"] == series, "n"]))
            for n in ns:
                ra = ea.loc[(series, n)] if (series, n) in ea.index else None
                rb = eb.loc[(series, n)] if (series, n) in eb.index else None
                rows.append(_ratio_row(a, b, series, int(n), ra, rb, util_col, util_name))
    return pd.DataFrame(rows)


def _settings(study: StudyResults, series: str, n: int) -> dict:
    g = study.runs[(study.runs["series"] == series) & (study.runs["n"] == n)]
    return {k: _mode_value(g[k]) for k in SETTINGS if k in g.columns}


def _x_dist(study: StudyResults, series: str, n: int, tokens: float) -> np.ndarray | None:
    boot = study.boots.get((series, n))
    if boot is None or not len(boot):
        return None
    return tokens / (boot * n)


def _ratio_row(a: StudyResults, b: StudyResults, series, n, ra, rb, util_col, util_name) -> dict:
    nan = float("nan")
    row = {"series": series, "mode": (ra if ra is not None else rb)["mode"], "n": n,
           "study": b.label, "baseline": a.label}
    for tag, r in (("a", ra), ("b", rb)):
        ok = r is not None and r["status"] == "ok"
        row[f"status_{tag}"] = r["status"] if r is not None else "not in study"
        row[f"step_time_{tag}_s"] = r["step_time_s"] if ok else nan
        row[f"throughput_{tag}"] = r["tokens_per_s_per_device"] if ok else nan
        row[f"efficiency_{tag}"] = r["efficiency"] if ok else nan
        row[f"util_{tag}"] = r[util_col] if ok else nan
    row["util_kind"] = util_name
    sa, sb = _settings(a, series, n), _settings(b, series, n)
    row["differs"] = "; ".join(f"{k}: {sa.get(k)} -> {sb.get(k)}" for k in SETTINGS
                               if sa.get(k) and sb.get(k) and sa.get(k) != sb.get(k))
    for c in ("throughput_ratio", "efficiency_ratio", "util_ratio"):
        row[c] = row[f"{c}_ci_lo"] = row[f"{c}_ci_hi"] = nan
    if ra is None or rb is None:
        return row
    xa = _x_dist(a, series, n, float(ra["tokens_per_step"]))
    xb = _x_dist(b, series, n, float(rb["tokens_per_step"]))
    if xa is None or xb is None:
        return row
    row["throughput_ratio"] = row["throughput_b"] / row["throughput_a"]
    row["throughput_ratio_ci_lo"], row["throughput_ratio_ci_hi"] = _ci(xb / xa)
    if np.isfinite(row["util_a"]) and np.isfinite(row["util_b"]):
        k = (row["util_b"] / row["throughput_b"]) / (row["util_a"] / row["throughput_a"])
        row["util_ratio"] = row["util_b"] / row["util_a"]
        row["util_ratio_ci_lo"] = row["throughput_ratio_ci_lo"] * k
        row["util_ratio_ci_hi"] = row["throughput_ratio_ci_hi"] * k
    # efficiency: each study against its own baseline N0
    ea, eb = [], []
    for s, r, x, out in ((a, ra, xa, ea), (b, rb, xb, eb)):
        n0 = r["baseline_n"]
        base = s.eff[(s.eff["series"] == series) & (s.eff["n"] == n0)]
        if pd.isna(n0) or base.empty:
            return row
        x0 = _x_dist(s, series, int(n0), float(base["tokens_per_step"].iloc[0]))
        if x0 is None:
            return row
        out.append(x / x0)
    if np.isfinite(row["efficiency_a"]) and np.isfinite(row["efficiency_b"]):
        row["efficiency_ratio"] = row["efficiency_b"] / row["efficiency_a"]
        row["efficiency_ratio_ci_lo"], row["efficiency_ratio_ci_hi"] = _ci(eb[0] / ea[0])
    return row


# --- outputs ---------------------------------------------------------------------------------


def _f(x, spec=".3g") -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return format(v, spec) if np.isfinite(v) else "–"


def _r(v, lo, hi) -> str:
    if not np.isfinite(v):
        return "–"
    if np.isfinite(lo) and np.isfinite(hi):
        return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"
    return f"{v:.3f}"


def markdown(studies: list[StudyResults], table: pd.DataFrame, differing: list[str],
             only: dict[str, list[str]]) -> str:
    out = ["# Comparison of scaling studies", ""]
    out.append(f"Baseline: **{studies[0].label}**. Ratios are study / baseline with bootstrap "
               "95% CIs (throughput per device X = tokens/step / (step time × N); efficiency "
               "E = X(N)/X(N₀), each study against its own N₀).")
    out += ["", "| study | folder | " + " | ".join(ENV_FIELDS) + " |",
            "|---|---|" + "---|" * len(ENV_FIELDS)]
    for s in studies:
        out.append(f"| {md_text(s.label)} | {md_text(s.path)} | "
                   + " | ".join(md_text(s.env.get(k) or "–") for k in ENV_FIELDS) + " |")
    if differing:
        out += ["", f"Environment that differs: {md_text(', '.join(differing))}."]
    if not table.empty:
        util = str(table["util_kind"].iloc[0])
        head = ["study", "series", "N", "step time ms (base → study)", "throughput ratio [95% CI]",
                "efficiency (base → study)", "efficiency ratio [95% CI]", f"{util} ratio",
                "status", "differs"]
        out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in table.itertuples(index=False):
            status = r.status_a if r.status_a == r.status_b else f"{r.status_a} → {r.status_b}"
            out.append("| " + " | ".join([
                md_text(r.study), md_text(r.series), str(r.n),
                f"{_f(r.step_time_a_s * 1e3, '.4g')} → {_f(r.step_time_b_s * 1e3, '.4g')}",
                _r(r.throughput_ratio, r.throughput_ratio_ci_lo, r.throughput_ratio_ci_hi),
                f"{_f(r.efficiency_a, '.3f')} → {_f(r.efficiency_b, '.3f')}",
                _r(r.efficiency_ratio, r.efficiency_ratio_ci_lo, r.efficiency_ratio_ci_hi),
                _r(r.util_ratio, r.util_ratio_ci_lo, r.util_ratio_ci_hi),
                md_text(status), md_text(r.differs or ""),
            ]) + " |")
    for s, names in only.items():
        if names:
            out.append(f"\nOnly in {md_text(s)}: {md_text(', '.join(names))} (drawn, not compared).")
    return "\n".join(out) + "\n"


def figures(studies: list[StudyResults], out: Path, style: str = "default") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")

    from scalestudy.record.io import write_text
    from scalestudy.report import style as fstyle

    util_col, util_name = _util_column(studies)
    metrics = [("compare_efficiency", "efficiency", "scaling efficiency E(N) = X(N)/X(N₀)", 1),
               ("compare_throughput", "tokens_per_s_per_device", "tokens/s per device", 1),
               ("compare_mfu", util_col, f"{util_name} (%)", 100)]
    series = list(dict.fromkeys(x for s in studies for x in s.eff["series"]))
    colours = fstyle.series_styles(series)
    paths = []
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")  # as the study's own figures
    with fstyle.applied(style):
        for name, col, ylabel, scale in metrics:
            fig, ax = fstyle.new_figure(style)
            rows = []
            for i, s in enumerate(studies):
                marker = fstyle.MARKERS[i % len(fstyle.MARKERS)]
                ls = fstyle.LINESTYLES[i % len(fstyle.LINESTYLES)]
                for ser, g in s.eff.groupby("series", sort=False):
                    g = g[g[col].notna()].sort_values("n")
                    if g.empty:
                        continue
                    ax.plot(g["n"], g[col] * scale, color=colours[ser]["color"], marker=marker,
                            linestyle=ls, label=f"{ser} — {s.label}")
                    rows.append(g.assign(study=s.label, folder=str(s.path)))
            if col == "efficiency":
                ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1, label="ideal (E = 1)")
            ns = sorted({int(n) for s in studies for n in s.eff["n"]})
            ax.set_xscale("log", base=2)
            if ns:
                ax.set_xticks(ns)
                ax.set_xticklabels([str(n) for n in ns])
                ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.set_xlabel("devices N (log2)")
            ax.set_ylabel(ylabel)
            ax.set_title("colour: series; marker and line: study",
                         fontsize=9 if style == "default" else None)
            fstyle.legend(fig, ax, style)
            paths += fstyle.save(fig, [out / f"{name}.png", out / f"{name}.pdf"], style)
            data = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
            keep = [c for c in ("study", "folder", "series", "mode", "n", col, f"{col}_ci_lo",
                                f"{col}_ci_hi", "status") if c in data.columns]
            p = out / f"{name}.csv"
            write_text(p, data[keep].to_csv(index=False, float_format="%.6g") if rows else "")
            paths.append(p)
    return paths


def compare(paths: list[Path], out: Path, style: str = "default") -> tuple[pd.DataFrame, str]:
    """Compare the studies in ``paths`` (the first is the baseline); write ``out``."""
    from scalestudy.record.io import atomic_path, write_text

    if len(paths) < 2:
        raise CompareError("give at least two study results folders")
    studies = [load_results(p, i) for i, p in enumerate(paths)]
    differing = label(studies)
    shared = check_definitions(studies)
    table = ratios(studies, shared)
    only = {s.label: [x for x in dict.fromkeys(s.runs["series"]) if x not in shared]
            for s in studies}
    md = markdown(studies, table, differing, only)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "compare.csv") as tmp:
        table.to_csv(tmp, index=False, float_format="%.6g")
    write_text(out / "compare.md", md)
    figures(studies, out, style)
    return table, md
