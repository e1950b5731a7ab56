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
every point split into its terms); where the study has been run
(``results/<study>/runs.csv``) the measured step time is set against it with the residual
``(predicted - measured) / measured``: ``predict_vs_measured.csv`` and ``.png``.

Without a study, or when the study lists ``references: [frontier_dash2024]``, the published
comparison is made at real scale on ``--hardware`` (default ``frontier``):
``predict_vs_published.csv`` / ``.md`` (predicted value, its range, the published value
and whether it lies inside), ``predict_points.csv``, ``predict_breakdown.csv`` /
``predict_breakdown.png`` and the figures ``predict_mfu.png`` / ``predict_scaling.png``.

The points at scale are the Frontier study's configurations (reference data
``frontier_dash2024_configs``: per model the row marked ``headline``, each choice with its
source in the ``source`` column): the model-parallel shape (tp, pp, micro-batch, ZeRO stage,
checkpointing) is kept and data parallelism grows from the script's GCD count to the paper's
largest, doubling (and the largest). Weak: the global batch grows with dp (micro-batches per
pipeline fixed). Strong: the global batch is held at ``strong_global_batch`` of the row (the
weak series' batch at the largest N, so both series meet there; the paper does not give its
strong-scaling batch), and the range also covers ``strong_global_batch_alt`` (the script's
own batch, or the nearest one every N divides). A study file may instead list the points under
``predict: {points: [...]}`` (resolved points, docs/architecture.md).

What the published figure measured: Megatron-DeepSpeed's counter divides its FLOPs (recompute
counted, i.e. HFU) by the logged iteration time, and that interval includes the evaluation run
after the previous iteration (``megatron/training.py``: ``timers('interval-time')`` spans
``evaluate_and_print_results``). The launch scripts evaluate ``eval_iters`` iterations every
``eval_interval``; the predicted figure averages the logged iterations: ``step + eval_iters /
eval_interval × evaluation_seconds`` (the forward-only pipeline). The range covers the
evaluation at the ratio measured in the study's one log (``eval_train_ratio_logged``) and, where
some logged iterations have none (``eval_interval > 1``), none. Efficiencies are relative to
the smallest N of the series: weak ``T(N0)/T(N)``, strong ``T(N0)·N0/(T(N)·N)``, each range
the envelope over the scenarios of ``HardwareSpec.scenarios`` (same scenario at both N).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from scalestudy.analysis.efficiency import per_device_throughput
from scalestudy.config.point import Model, Parallel, Platform, Point, Train
from scalestudy.perf import stepmodel

MODELS = ("gpt-22b", "gpt-175b", "gpt-1t")
#: DeepSpeed's ZeRO stage -> the data-parallel mode that holds the same state per device.
ZERO_STAGE_DP_MODE = {0: "ddp", 1: "zero1", 2: "fsdp_grad_op", 3: "fsdp"}
#: Breakdown terms in stacked-bar order, with their legend labels.
TERM_LABELS = {
    "gemm_s": "GEMMs", "attention_s": "attention", "elementwise_s": "memory-bound kernels",
    "overhead_s": "framework overhead", "tp_comm_s": "TP comm (exposed)",
    "pp_p2p_s": "PP p2p (exposed)", "pp_bubble_s": "pipeline bubble",
    "dp_comm_exposed_s": "DP comm (exposed)", "optimizer_s": "optimizer",
    "eval_s": "evaluation (in the logged time)",
}


def reference(name: str):
    """A published reference table as a DataFrame (``scalestudy.references.load``)."""
    from scalestudy.report.references import load

    return load(name)


def _num(x, default=None):
    """A CSV cell as a number, ``default`` when empty."""
    try:
        if x is None or (isinstance(x, float) and math.isnan(x)) or x == "":
            return default
        return float(x)
    except (TypeError, ValueError):
        return default


def config_point(row, dp: int, global_batch: int, mode: str = "strong") -> Point:
    """The point of a row of ``frontier_dash2024_configs`` at data parallelism ``dp`` and
    ``global_batch``: Megatron-DeepSpeed's GPT (GELU 4h, biases, tied embeddings), bf16 (the
    same peak as the scripts' fp16), the row's ZeRO stage and checkpointing, FlashAttention
    unless the row says none."""
    tp, pp, mb = int(row["tp"]), int(row["pp"]), int(row["micro_batch"])
    if global_batch % (dp * mb):
        raise ValueError(f"global_batch={global_batch} is not a multiple of dp·micro_batch={dp * mb}")
    zs = int(_num(row.get("zero_stage"), 0))
    ckpt = str(row["activation_checkpointing"]).lower() in ("true", "1", "yes")
    model = Model(name=str(row["model"]), vocab=int(row["vocab"]), seq_len=int(row["seq_len"]),
                  layers=int(row["layers"]), hidden=int(row["hidden"]), heads=int(row["heads"]),
                  tied_embeddings=True,
                  attention="math" if str(row["flash_attention"]) == "none" else "fused")
    return Point.build(
        model, n=tp * pp * dp, tp=tp, pp=pp, micro_batch=mb, global_batch=global_batch,
        parallel=Parallel(dp_mode=ZERO_STAGE_DP_MODE[zs],
                          activation_checkpointing="full" if ckpt else "none"),
        train=Train(precision="bf16"),
        platform=Platform(device="cuda", hardware="MI250X-GCD", devices_per_node=8),
        study="frontier-predict", series=str(row["model"]), mode=mode)


def pick_configs(configs, published) -> dict:
    """Per model, the launch-script row marked ``headline`` in the reference data (its
    ``source`` says why); without that column, the row whose sequence length matches the
    published one, preferring FlashAttention-2, then the later script."""
    out = {}
    for model in MODELS:
        pub = published[published["model"] == model]
        rows = configs[configs["model"] == model]
        if rows.empty or pub.empty:
            continue
        if "headline" in rows:
            marked = rows[rows["headline"].astype(str).str.lower() == "true"]
            if not marked.empty:
                out[model] = marked.iloc[-1]
                continue
        s = int(pub.iloc[0]["seq_len"])
        same = rows[rows["seq_len"] == s]
        rows = same if not same.empty else rows
        fa2 = rows[rows["flash_attention"].astype(str) == "v2"]
        out[model] = (fa2 if not fa2.empty else rows).iloc[-1]
    return out


def _fit_batch(gb: int, dps: list[int], mb: int) -> int:
    """``gb`` if every ``dp × mb`` of the series divides it, else the nearest multiple of
    their least common multiple."""
    lcm = mb
    for x in dps:
        lcm = lcm * x * mb // math.gcd(lcm, x * mb)
    return gb if gb % lcm == 0 else max(lcm, round(gb / lcm) * lcm)


def frontier_series(row, n_max: int | None) -> dict[str, list[Point]]:
    """``{"mfu": [point], "weak": [...], "strong": [...], "strong_alt": [...]}`` for one
    configuration row: dp doubles from the row's up to the published largest N (always
    included). Weak: global batch ∝ dp. Strong: the row's ``strong_global_batch`` held at
    every N (default: the weak series' batch at the largest N); ``strong_alt``: the row's
    ``strong_global_batch_alt`` (default: the row's own batch, fitted to every N)."""
    tp, pp, dp0, mb = int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["micro_batch"])
    gb0 = int(row["global_batch"])
    n0 = tp * pp * dp0
    out = {"mfu": [config_point(row, dp0, gb0, "strong")], "weak": [], "strong": [],
           "strong_alt": []}
    if not n_max or n_max <= n0:
        return out
    dps, d = [], dp0
    while tp * pp * d < n_max:
        dps.append(d)
        d *= 2
    dps = [x for x in dps if tp * pp * x < n_max] + [n_max // (tp * pp)]
    if len(dps) < 2:
        return out
    gb_strong = int(_num(row.get("strong_global_batch"), gb0 * dps[-1] // dp0))
    gb_alt = int(_num(row.get("strong_global_batch_alt"), gb0))
    out["weak"] = [config_point(row, x, gb0 * x // dp0, "weak") for x in dps
                   if (gb0 * x) % dp0 == 0]
    out["strong"] = [config_point(row, x, _fit_batch(gb_strong, dps, mb)) for x in dps]
    out["strong_alt"] = [config_point(row, x, _fit_batch(gb_alt, dps, mb)) for x in dps]
    return out


def eval_variants(row) -> dict[str, float]:
    """``{label: ratio}``: the evaluation share a logged iteration carries, as a factor on
    the modelled evaluation (``"model"``: 1), or, for ``"log"``, ``None`` (the ratio measured
    in the study's log replaces the model's); ``"none"`` (0) where ``eval_interval > 1``
    leaves logged iterations without one. Empty when the run does not evaluate."""
    interval, iters = _num(row.get("eval_interval")), _num(row.get("eval_iters"))
    if not interval or not iters:
        return {}
    out = {"model": 1.0, "log": None}
    if interval > 1:
        out["none"] = 0.0
    return out


def logged_seconds(step_s: float, eval_s: float, row, variant: str, logged_ratio: float | None) -> float:
    """The mean logged iteration time (seconds) under an evaluation variant: ``step +
    eval_iters / eval_interval × evaluation`` (module doc)."""
    interval, iters = _num(row.get("eval_interval")), _num(row.get("eval_iters"))
    if not interval or not iters or variant == "none":
        return step_s
    k = iters / interval
    if variant == "log" and logged_ratio:
        return step_s * (1.0 + k * logged_ratio)
    return step_s + k * eval_s


def _logged_ratio(configs) -> float | None:
    if configs is None or "eval_train_ratio_logged" not in configs:
        return None
    vals = [v for v in (_num(x) for x in configs["eval_train_ratio_logged"]) if v]
    return vals[0] if vals else None


def _evaluate(points: list[Point], hw, measured, dp_overlap, row, logged_ratio) -> dict:
    """Per point (by n): {scenario label: (breakdown, logged seconds, eval seconds)} over
    the hardware scenarios × evaluation variants."""
    out = {}
    variants = eval_variants(row) if row is not None else {}
    scen = hw.scenarios()
    for p in points:
        res = {}
        for label, h in scen:
            b = stepmodel.predict_step_time(p, h, measured, dp_overlap)
            e = stepmodel.evaluation_seconds(p, h, measured) if variants else 0.0
            if not variants:
                res[label] = (b, b.step_time_s, 0.0)
                continue
            for v in variants:
                t = logged_seconds(b.step_time_s, e, row, v, logged_ratio)
                key = label if v == "model" else f"{label} / eval {v}"
                res[key] = (b, t, t - b.step_time_s)
        out[p.n] = res
    return out


def run(hw: stepmodel.HardwareSpec, measured: stepmodel.Measured | None = None,
        dp_overlap: float | None = None, points: list[Point] | None = None):
    """Predictions for every series point and the comparison table. Returns
    ``(points_df, comparison_df, breakdown_df)``."""
    import pandas as pd

    published = reference("frontier_dash2024")
    configs = reference("frontier_dash2024_configs")
    logged_ratio = _logged_ratio(configs)
    series: dict[str, dict] = {}
    rows_of: dict[str, object] = {}
    if points is None:
        for model, row in pick_configs(configs, published).items():
            pub = published[published["model"] == model].iloc[0]
            n_max = None if pd.isna(pub["gpus_max"]) else int(pub["gpus_max"])
            series[model] = frontier_series(row, n_max)
            rows_of[model] = row
    else:
        for p in points:
            series.setdefault(p.model.name, {}).setdefault(p.mode, []).append(p)
    rows, brk = [], []
    ranges: dict[tuple, dict] = {}
    for model, by_kind in series.items():
        row = rows_of.get(model)
        for kind, pts in by_kind.items():
            pts = sorted(pts, key=lambda q: q.n)
            if not pts:
                continue
            res = _evaluate(pts, hw, measured, dp_overlap, row, logged_ratio)
            first = res[pts[0].n]
            for p in pts:
                r = res[p.n]
                b, logged, ev = r["central"]
                ckpt = p.parallel.activation_checkpointing
                flops_key = "hardware_flops_per_step" if ckpt != "none" else "model_flops_per_step"
                peak = hw.peak(str(p.train.precision))

                def pct(item):
                    bb, t, _ = item
                    return 100 * getattr(bb, flops_key) / (t * p.n * peak)

                def eff(label):
                    x = per_device_throughput(p.tokens_per_step, r[label][1], p.n)
                    x0 = per_device_throughput(pts[0].tokens_per_step, first[label][1], pts[0].n)
                    return 100 * x / x0

                pcts = [pct(v) for v in r.values()]
                effs = [eff(k) for k in r]
                ranges[(model, kind, p.n)] = {"pct": (min(pcts), max(pcts)),
                                              "eff": (min(effs), max(effs))}
                rows.append({
                    "model": model, "series": kind, **shape_columns(p), "seq_len": p.seq_len,
                    "dp_mode": p.parallel.dp_mode, "activation_checkpointing": ckpt,
                    **{k: v for k, v in b.row().items() if isinstance(v, (int, float, str))},
                    "step_time_low_s": min(v[0].step_time_s for v in r.values()),
                    "step_time_high_s": max(v[0].step_time_s for v in r.values()),
                    "eval_s": ev, "logged_iteration_s": logged,
                    "pct_of_peak_logged": pct(r["central"]),
                    "pct_of_peak_logged_low": min(pcts), "pct_of_peak_logged_high": max(pcts),
                    "efficiency": eff("central") / 100,
                    "efficiency_low": min(effs) / 100, "efficiency_high": max(effs) / 100,
                })
                brk.append(breakdown_row(f"{model} {kind} N={p.n}", b, p, extra={"eval_s": ev}))
    df = pd.DataFrame(rows)
    comp = comparison(df, published, ranges)
    return df, comp, pd.DataFrame(brk)


def shape_columns(p: Point) -> dict:
    """A point's parallel shape and batch as table columns."""
    return {"n": p.n, "dp": p.dp, "tp": p.tp, "pp": p.pp, "micro_batch": p.micro_batch,
            "grad_accum": p.grad_accum, "global_batch": p.global_batch}


def breakdown_row(label: str, b: stepmodel.StepBreakdown, p: Point, extra: dict | None = None) -> dict:
    """One point's terms in seconds per step and as % of the (logged) time."""
    terms = {**b.terms(), **(extra or {})}
    total = sum(terms.values())
    out = {"point": label, "series": p.series, "mode": p.mode, **shape_columns(p),
           "step_time_s": b.step_time_s, "total_s": total, "bottleneck_stage": b.bottleneck_stage}
    out.update({k: v for k, v in terms.items()})
    out.update({f"pct_{k[:-2]}": 100 * v / total for k, v in terms.items()})
    return out


def _interval(pub, col: str, scale: float = 1.0) -> tuple[float, float]:
    """The published value's interval from its printed resolution (``<col>_resolution``)."""
    import pandas as pd

    v = float(pub[col]) * scale
    res = pub.get(f"{col}_resolution")
    half = 0.0 if res is None or pd.isna(res) else float(res) * scale / 2
    return v - half, v + half


def comparison(df, published, ranges: dict):
    """The predicted-vs-published table: every published figure with the predicted value,
    its range, the published interval (printed resolution) and whether the two overlap."""
    import pandas as pd

    comp = []
    for _, pub in published.iterrows():
        model = pub["model"]
        sub = df[df["model"] == model]
        if sub.empty:
            continue
        m = sub[sub["series"] == "mfu"].iloc[0]
        lo, hi = ranges[(model, "mfu", m["n"])]["pct"]
        comp.append(_cmp(model, "% of peak (logged, HFU)", m["n"], m["pct_of_peak_logged"],
                         (lo, hi), float(pub["pct_of_peak"]), _interval(pub, "pct_of_peak")))
        f = pub["peak_tflops_per_device"] / 100
        comp.append(_cmp(model, "TFLOPS per GCD", m["n"], m["pct_of_peak_logged"] * f,
                         (lo * f, hi * f), float(pub["tflops_per_device"]),
                         (float(pub["tflops_per_device"]) - 0.05, float(pub["tflops_per_device"]) + 0.05)))
        for kind, col in (("weak", "weak_scaling_efficiency"), ("strong", "strong_scaling_efficiency")):
            s = sub[sub["series"] == kind].sort_values("n")
            if s.empty or pd.isna(pub[col]):
                continue
            first, last = s.iloc[0], s.iloc[-1]
            lo, hi = ranges[(model, kind, last["n"])]["eff"]
            if kind == "strong":
                alt = sub[sub["series"] == "strong_alt"].sort_values("n")
                if not alt.empty:
                    a_lo, a_hi = ranges[(model, "strong_alt", alt.iloc[-1]["n"])]["eff"]
                    lo, hi = min(lo, a_lo), max(hi, a_hi)
            comp.append(_cmp(model, f"{kind} scaling efficiency (%), N0={first['n']}", last["n"],
                             100 * last["efficiency"], (lo, hi), 100 * float(pub[col]),
                             _interval(pub, col, 100)))
    return pd.DataFrame(comp)


def _cmp(model, metric, n, pred, rng, pub, pub_rng) -> dict:
    pred, pub = float(pred), float(pub)
    lo, hi = (float(x) for x in rng)
    return {"model": model, "metric": metric, "n": int(n), "predicted": pred,
            "predicted_low": lo, "predicted_high": hi, "published": pub,
            "published_low": pub_rng[0], "published_high": pub_rng[1],
            "rel_error": (pred - pub) / pub,
            "inside": bool(lo <= pub_rng[1] and pub_rng[0] <= hi)}


def markdown(comp, hw: stepmodel.HardwareSpec, brk=None) -> str:
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
              "description at the ends of its stated range (all slow, all fast, each alone), "
              "the evaluation share of the logged time, and for strong scaling the two global "
              "batches (docs/performance-model.md). No parameter is fitted to the published "
              "results."]
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    c = comp[comp["metric"].str.startswith("% of peak")].reset_index(drop=True)
    x = list(range(len(c)))
    err = [c["predicted"] - c["predicted_low"], c["predicted_high"] - c["predicted"]]
    ax.bar([i - 0.2 for i in x], c["predicted"], width=0.4, yerr=err, capsize=4,
           label="predicted (range)")
    ax.bar([i + 0.2 for i in x], c["published"], width=0.4, label="published")
    ax.set_xticks(x, c["model"])
    ax.set_ylabel("% of 191.5 TFLOPS (recompute counted)")
    ax.set_title("Per-GCD utilisation: model vs Dash et al. 2024")
    ax.legend()
    fig.tight_layout()
    paths.append(_save(fig, out / "predict_mfu.png"))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, kind in zip(axes, ("weak", "strong")):
        s = df[df["series"] == kind]
        for model, g in s.groupby("model"):
            g = g.sort_values("n")
            line, = ax.plot(g["n"], 100 * g["efficiency"], marker="o", label=f"{model} predicted")
            ax.fill_between(g["n"], 100 * g["efficiency_low"], 100 * g["efficiency_high"],
                            color=line.get_color(), alpha=0.15)
            alt = df[(df["series"] == f"{kind}_alt") & (df["model"] == model)].sort_values("n")
            if not alt.empty:  # the other strong-scaling batch (the range covers both)
                ax.plot(alt["n"], 100 * alt["efficiency"], "--", marker=".",
                        color=line.get_color(), label=f"{model} predicted, script's batch")
                ax.fill_between(alt["n"], 100 * alt["efficiency_low"], 100 * alt["efficiency_high"],
                                color=line.get_color(), alpha=0.1)
            pub = comp[(comp["model"] == model) & comp["metric"].str.startswith(kind)]
            if not pub.empty:
                ax.scatter(pub["n"], pub["published"], marker="*", s=150, color=line.get_color(),
                           label=f"{model} published")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GCDs")
        ax.set_title(f"{kind} scaling")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("efficiency (%)")
    fig.tight_layout()
    paths.append(_save(fig, out / "predict_scaling.png"))
    return paths


def term_styles() -> dict:
    """``{term: {"color", "hatch"}}``: one Okabe–Ito colour per breakdown term (the project's
    palette, ``report.style.PALETTE``), the same in every figure; past the palette's length
    the colours repeat with a hatch, so no two terms look alike."""
    from scalestudy.report.style import PALETTE

    return {k: {"color": PALETTE[i % len(PALETTE)],
                "hatch": "" if i < len(PALETTE) else "//"}
            for i, k in enumerate(TERM_LABELS)}


def breakdown_figure(brk, path: Path, title: str = "Where the step goes") -> Path:
    """A stacked bar per point: each term's share (%) of the (logged) step time, in the
    project's figure style (``report.style``: palette, fonts, legend beside the axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scalestudy.report import style as fstyle

    keys = [k for k in TERM_LABELS if k in brk and (brk[k] > 0).any()]
    styles = term_styles()
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


def study_predictions(points: list[Point], hw: stepmodel.HardwareSpec,
                      measured: stepmodel.Measured | None = None,
                      dp_overlap: float | None = None, breakdown: list | None = None):
    """Predicted step time (with its range), throughput, MFU and efficiency (vs each series'
    ``baseline_n``) of the feasible points of a planned study (one row per config, repeats
    collapsed). ``breakdown``: a list that receives each point's ``breakdown_row``."""
    import pandas as pd

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
    ``before``: a ``predicted_before_run.csv`` frame (``before_run_calibration``): its
    ``predicted_before_run_s`` and ``predicted_at`` join the larger points, with
    ``before_run_residual`` (the same residual for the prediction made before the run)."""
    ok = runs[runs["status"] == "ok"]
    meas = ok.groupby("config_hash", as_index=False)["step_time_median_s"].median()
    meas = meas.rename(columns={"step_time_median_s": "measured_step_time_s"})
    out = pred.merge(meas, on="config_hash", how="left")
    out["residual"] = (out["step_time_s"] - out["measured_step_time_s"]) / out["measured_step_time_s"]
    if before is not None and not before.empty:
        cols = ["config_hash", "predicted_before_run_s", "calibration_factor", "calibrated_on",
                "predicted_at"]
        out = out.merge(before[[c for c in cols if c in before]], on="config_hash", how="left")
        out["before_run_residual"] = ((out["predicted_before_run_s"] - out["measured_step_time_s"])
                                      / out["measured_step_time_s"])
    return out


def before_run_calibration(pred, runs, max_n: int, predicted_at: str = ""):
    """The model calibrated on the measured points with ``n <= max_n`` and its prediction for
    the others, made before they run: per series, the median measured / predicted step time
    of its calibration points (a series without one takes the median over every calibration
    point) times the model's prediction. Rows of the points with ``n > max_n``:
    ``series, n, config_hash, step_time_s`` (the model), ``calibration_factor``,
    ``calibrated_on`` (the points it came from), ``predicted_before_run_s``, ``predicted_at``
    (UTC, ISO 8601). Raises ``ValueError`` when no calibration point has been measured."""
    import statistics

    import pandas as pd

    ok = runs[runs["status"] == "ok"]
    meas = ok.groupby("config_hash")["step_time_median_s"].median()
    small = pred[(pred["n"] <= max_n) & pred["config_hash"].isin(meas.index)]
    if small.empty:
        raise ValueError(f"predict.before_run.calibrate_on_max_n={max_n}: no measured point with "
                         "N <= it to calibrate on (did they run?)")
    ratio = {r.config_hash: float(meas[r.config_hash]) / float(r.step_time_s)
             for r in small.itertuples()}
    overall = statistics.median(ratio.values())
    rows = []
    for r in pred[pred["n"] > max_n].itertuples():
        mine = small[small["series"] == r.series]
        if mine.empty:
            factor, on = overall, "all series, N <= %d" % max_n
        else:
            factor = statistics.median(ratio[h] for h in mine["config_hash"])
            on = f"{r.series} N=" + ",".join(str(int(n)) for n in sorted(mine["n"]))
        rows.append({"series": r.series, "n": int(r.n), "config_hash": r.config_hash,
                     "step_time_s": float(r.step_time_s), "calibration_factor": factor,
                     "calibrated_on": on, "predicted_before_run_s": factor * float(r.step_time_s),
                     "predicted_at": predicted_at})
    return pd.DataFrame(rows, columns=["series", "n", "config_hash", "step_time_s",
                                       "calibration_factor", "calibrated_on",
                                       "predicted_before_run_s", "predicted_at"])


def _save(fig, path: Path) -> Path:
    """Write a matplotlib figure atomically and close it."""
    from scalestudy.report.style import save

    return save(fig, path)[0]


def residual_figure(df, path: Path) -> Path:
    """Step time vs N per series: the model (line), the measurement (filled markers) and,
    where the study asked for it, the prediction made before the point ran (open markers);
    below, the residuals (%) with the ±30% band. The project's figure style
    (``report.style``: Okabe–Ito palette, a marker and line style per series)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from scalestudy.report import style as fstyle

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


def host_measurements(study_dir: Path) -> stepmodel.Measured:
    """The building blocks a CPU study measured on its own host during its run (the preset's
    figures stand in for what is missing): from ``calibration.json`` the rates of the study's
    own matrix products, the framework overhead and the copy bandwidth; from the
    ``microbench`` jobs (``microbench: {enabled: true}``) the collectives, and matmul rates
    where the calibration has none."""
    mb = study_dir / "microbench"
    bench = stepmodel.Measured.from_csv(*(str(mb / f) if (mb / f).exists() else None
                                          for f in ("matmul.csv", "collectives.csv")))
    cal = study_dir / "calibration.json"
    if not cal.exists():
        return bench
    own = stepmodel.Measured.from_calibration(cal)
    return replace(own, matmul=own.matmul or bench.matmul, collectives=bench.collectives)


def started_before(vm, runs, study_dir: Path):
    """``vm`` with ``started_at`` (the first start of each config's runs, UTC, from their
    ``status.json``) and ``predicted_before_start`` (the prediction's ``predicted_at`` is
    earlier: it was made before the point ran; NA where either is unknown)."""
    import pandas as pd

    starts = {}
    for h, g in runs.groupby("config_hash"):
        t = [x for x in (_started(study_dir, pid) for pid in g["point_id"]) if x]
        starts[h] = min(t, key=pd.Timestamp) if t else None
    out = vm.copy()
    out["started_at"] = out["config_hash"].map(starts)
    pa = pd.to_datetime(out.get("predicted_at"), utc=True, errors="coerce")
    st = pd.to_datetime(out["started_at"], utc=True, errors="coerce")
    out["predicted_before_start"] = (pa < st).where(pa.notna() & st.notna())
    return out


def _started(study_dir: Path, point_id) -> str | None:
    """When a point's run started (``status.json`` ``started``, UTC), or None."""
    from scalestudy.record.io import read_record

    if not point_id or not isinstance(point_id, str):
        return None
    rec = read_record(study_dir / "runs" / point_id / "status.json")
    return (rec or {}).get("started")


def _predict_before_run(study: dict, pred, study_dir: Path, path: Path) -> int:
    """``scalestudy predict STUDY --before-run``: write ``predicted_before_run.csv``."""
    import datetime as dt

    from scalestudy.analysis.aggregate import collect
    from scalestudy.config.study import before_run_max_n

    max_n = before_run_max_n(study)
    if max_n is None:
        print("scalestudy predict: --before-run needs predict: {before_run: "
              "{calibrate_on_max_n: N}} in the study file", file=sys.stderr)
        return 2
    runs, _, _ = collect(study_dir)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    try:
        before = before_run_calibration(pred, runs, max_n, now)
    except ValueError as e:
        print(f"scalestudy predict: {e}", file=sys.stderr)
        return 2
    _write_csv(before, path)
    for r in before.itertuples():
        print(f"{r.series} N={r.n}: predicted before run {r.predicted_before_run_s * 1e3:.1f} ms "
              f"(model {r.step_time_s * 1e3:.1f} ms x {r.calibration_factor:.2f}, "
              f"calibrated on {r.calibrated_on})")
    print(f"-> {path}")
    return 0


def _write_csv(df, path: Path) -> None:
    from scalestudy.record.io import atomic_path

    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalestudy predict", description=__doc__.splitlines()[0])
    ap.add_argument("study", nargs="?", help="study YAML: predict its points (and compare with runs.csv)")
    ap.add_argument("--hardware", default=None,
                    help="preset name or YAML path (default: cpu-local for a CPU study, frontier "
                         "for the published comparison)")
    ap.add_argument("--framework", default=None,
                    help="framework of hardware.yaml driving the hardware (default: the preset's)")
    ap.add_argument("--results", default="results", help="results root (default results/)")
    ap.add_argument("--out", default=None, help="output folder (default <results>/<study>/predict)")
    ap.add_argument("--runs", default=None, help="runs.csv to compare with (default <results>/<study>/runs.csv)")
    ap.add_argument("--matmul-csv", help="microbench matmul CSV measured on that hardware")
    ap.add_argument("--collectives-csv", help="microbench collectives CSV measured on that hardware")
    ap.add_argument("--dp-overlap", type=float, default=None)
    ap.add_argument("--before-run", action="store_true",
                    help="with a study asking for predict.before_run: calibrate the model on "
                         "its measured points with N <= calibrate_on_max_n and write the other "
                         "points' prediction, before they run, to predict/predicted_before_run.csv")
    a = ap.parse_args(argv)

    import pandas as pd

    from scalestudy.record.io import write_text

    def load_hw(name: str) -> stepmodel.HardwareSpec:
        hw = stepmodel.HardwareSpec.load(name)
        return hw.with_framework(a.framework) if a.framework else hw

    explicit = None
    if a.matmul_csv or a.collectives_csv:
        explicit = stepmodel.Measured.from_csv(a.matmul_csv, a.collectives_csv)
    compare_published, name = True, "frontier"
    if a.study:
        from scalestudy.plan.planner import plan_points
        from scalestudy.config.study import load_study

        # nothing is launched from here: the site settings' policy does not apply
        study = load_study(a.study, trust_site=True)
        name = study["name"]
        out = Path(a.out or f"{a.results}/{name}/predict")
        compare_published = "frontier_dash2024" in study.get("references", [])
        device = study["platform"].get("device", "auto")
        if a.hardware:
            hw, measured = load_hw(a.hardware), explicit
        elif device in ("cpu", "auto"):
            hw = load_hw("cpu-local")
            measured = explicit or host_measurements(Path(a.results) / name)
        else:
            print("scalestudy predict: --hardware is required for a GPU study (a preset such as "
                  f"{', '.join(stepmodel.presets())} or a YAML path)", file=sys.stderr)
            return 2
        brk: list = []
        pred = study_predictions(plan_points(study), hw, measured, a.dp_overlap, breakdown=brk)
        before_csv = out / "predicted_before_run.csv"
        if a.before_run:
            return _predict_before_run(study, pred, Path(a.results) / name, before_csv)
        _write_csv(pred, out / "study_predictions.csv")
        if brk:
            brk_df = pd.DataFrame(brk)
            _write_csv(brk_df, out / "study_breakdown.csv")
            breakdown_figure(brk_df, out / "study_breakdown.png",
                             f"Where the step goes: {name} on {hw.name}")
        runs_path = Path(a.runs or f"{a.results}/{name}/runs.csv")
        if runs_path.exists() and not pred.empty:
            before = pd.read_csv(before_csv) if before_csv.exists() else None
            runs_df = pd.read_csv(runs_path)
            vm = versus_measured(pred, runs_df, before)
            if before is not None:
                vm = started_before(vm, runs_df, Path(a.results) / name)
            _write_csv(vm, out / "predict_vs_measured.csv")
            residual_figure(vm, out / "predict_vs_measured.png")
            have = vm["residual"].notna()
            print(f"predicted vs measured on {hw.name}: {int(have.sum())} points, residual median "
                  f"{vm.loc[have, 'residual'].median():+.1%}, max |residual| "
                  f"{vm.loc[have, 'residual'].abs().max():.1%}" if have.any() else
                  "no measured point to compare with yet")
        print(f"{len(pred)} study points predicted on {hw.name} -> {out}/study_predictions.csv")
    else:
        out = Path(a.out or f"{a.results}/{name}/predict")
    if compare_published:
        hw = load_hw(a.hardware or "frontier")
        df, comp, brk_df = run(hw, explicit, a.dp_overlap)
        _write_csv(df, out / "predict_points.csv")
        _write_csv(comp, out / "predict_vs_published.csv")
        _write_csv(brk_df, out / "predict_breakdown.csv")
        md = markdown(comp, hw, brk_df)
        write_text(out / "predict_vs_published.md", md)
        figures(df, comp, out)
        breakdown_figure(brk_df, out / "predict_breakdown.png",
                         f"Where the logged iteration goes: Frontier study on {hw.name}")
        print(md)
    print(f"-> {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
