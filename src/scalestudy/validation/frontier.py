"""The Frontier study (Dash et al., ISC 2024, arXiv:2312.12705) at real scale: its launch
scripts' configurations as points, the weak and strong series, and what its log printed.

The points at scale are the configurations of the reference data
``frontier_dash2024_configs`` (per model the row marked ``headline``, each choice with its
source in the ``source`` column): the model-parallel shape (tp, pp, micro-batch, ZeRO stage,
checkpointing) is kept and data parallelism grows from the script's GCD count to the paper's
largest, doubling (and the largest). Weak: the global batch grows with dp (micro-batches per
pipeline fixed). Strong: the paper does not give its batch; the series is predicted at both
``strong_global_batch`` (an assumption: the weak series' batch at the largest N) and
``strong_global_batch_alt`` (the script's own batch, or the nearest one every N divides), each
a row of its own, so that neither is chosen silently.

What the published figure measured: Megatron-DeepSpeed's counter divides its FLOPs (recompute
counted, i.e. HFU) by the logged iteration time, and the evaluation run after an iteration falls
into the next logged interval (``megatron/training.py``: ``timers('interval-time')`` spans
``evaluate_and_print_results``). The scripts log every iteration and evaluate ``eval_iters``
iterations every ``eval_interval``; the study's one published log gives the cost of an
evaluation iteration as a fraction of a training iteration (``eval_train_ratio_logged``, 0.143).
Which mean of the logged lines the paper reports is not stated, so both are computed
(``logged_factor``): the time-weighted mean (total FLOPs over total time) and the mean of the
printed per-line figures (two lines in three carry no evaluation when ``eval_interval`` is 3).
"""

from __future__ import annotations

import math

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Parallel, Platform, Train
from scalestudy.config import flops
from scalestudy.perf import stepmodel
from scalestudy.config.flops import per_device_throughput
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import Measured
from scalestudy.perf.tables import breakdown_row, shape_columns
from scalestudy.reference_data import load

MODELS = ("gpt-22b", "gpt-175b", "gpt-1t")
#: DeepSpeed's ZeRO stage -> the data-parallel mode that holds the same state per device.
ZERO_STAGE_DP_MODE = {0: "ddp", 1: "zero1", 2: "fsdp_grad_op", 3: "fsdp"}
#: The two means of the logged lines (module doc).
MEANS = ("time-weighted", "per-line")


def reference(name: str):
    """A published reference table as a DataFrame (``scalestudy.reference_data.load``)."""
    return load(name)


def num(x, default=None):
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
    zs = int(num(row.get("zero_stage"), 0))
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


def fit_batch(gb: int, dps: list[int], mb: int) -> int:
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
    gb_strong = int(num(row.get("strong_global_batch"), gb0 * dps[-1] // dp0))
    gb_alt = int(num(row.get("strong_global_batch_alt"), gb0))
    out["weak"] = [config_point(row, x, gb0 * x // dp0, "weak") for x in dps
                   if (gb0 * x) % dp0 == 0]
    out["strong"] = [config_point(row, x, fit_batch(gb_strong, dps, mb)) for x in dps]
    out["strong_alt"] = [config_point(row, x, fit_batch(gb_alt, dps, mb)) for x in dps]
    return out


def logged_factor(row, ratio: float | None, mean: str = "time-weighted") -> float:
    """The logged iteration's time as a multiple of the training step's, for the mean of the
    logged lines ``mean`` (``MEANS``), when ``eval_iters`` evaluation iterations of
    ``ratio`` × a training step each fall into one logged line in ``eval_interval``
    (module doc). Time-weighted: ``1 + k·r/I``; per line: ``I / ((I - 1) + 1 / (1 + k·r))``
    (the harmonic mean of the lines' times). 1 where the run does not evaluate."""
    if mean not in MEANS:
        raise ValueError(f"mean={mean!r}: use one of {', '.join(MEANS)}")
    interval, iters = num(row.get("eval_interval")), num(row.get("eval_iters"))
    if not interval or not iters or not ratio:
        return 1.0
    k, i = iters * ratio, interval
    if mean == "time-weighted":
        return 1.0 + k / i
    return i / ((i - 1) + 1.0 / (1.0 + k))


def logged_ratio(configs) -> float | None:
    """The evaluation-to-training ratio measured in the study's log (reference data)."""
    if configs is None or "eval_train_ratio_logged" not in configs:
        return None
    vals = [v for v in (num(x) for x in configs["eval_train_ratio_logged"]) if v]
    return vals[0] if vals else None


def run(hw: HardwareSpec, measured: Measured | None = None,
        dp_overlap: float | None = None, ranges: bool = True):
    """Predictions for every series point and the comparison table. Returns
    ``(points_df, comparison_df, breakdown_df)``; the range of every figure is the envelope
    over ``hw.scenarios()``, the same scenario at every N of a series (``ranges=False``: the
    central values only, as fast as a fit needs)."""
    import pandas as pd

    published = reference("frontier_dash2024")
    configs = reference("frontier_dash2024_configs")
    ratio = logged_ratio(configs)
    rows, brk = [], []
    scen = hw.scenarios() if ranges else [("central", hw)]
    for model, row in pick_configs(configs, published).items():
        pub = published[published["model"] == model].iloc[0]
        n_max = None if pd.isna(pub["gpus_max"]) else int(pub["gpus_max"])
        f = {m: logged_factor(row, ratio, m) for m in MEANS}
        for kind, pts in frontier_series(row, n_max).items():
            pts = sorted(pts, key=lambda q: q.n)
            if not pts:
                continue
            res = {p.n: {lab: stepmodel.predict_step_time(p, h, measured, dp_overlap)
                         for lab, h in scen} for p in pts}
            first = res[pts[0].n]
            for p in pts:
                r = res[p.n]
                b = r["central"]
                peak = hw.peak(str(p.train.precision))

                def pct(bb, mean):
                    return 100 * bb.hardware_flops_per_step / (bb.step_time_s * f[mean] * p.n * peak)

                def eff(label):
                    x = per_device_throughput(p.tokens_per_step, r[label].step_time_s, p.n)
                    x0 = per_device_throughput(pts[0].tokens_per_step, first[label].step_time_s,
                                               pts[0].n)
                    return x / x0

                effs = [eff(k) for k in r]
                rec = {"model": model, "series": kind, **shape_columns(p), "seq_len": p.seq_len,
                       "dp_mode": p.parallel.dp_mode,
                       "activation_checkpointing": p.parallel.activation_checkpointing,
                       **{k: v for k, v in b.row().items() if isinstance(v, (int, float, str))},
                       "step_time_low_s": min(v.step_time_s for v in r.values()),
                       "step_time_high_s": max(v.step_time_s for v in r.values()),
                       "logged_iteration_s": b.step_time_s * f["time-weighted"],
                       "eval_s": b.step_time_s * (f["time-weighted"] - 1),
                       "efficiency": eff("central"), "efficiency_low": min(effs),
                       "efficiency_high": max(effs)}
                for mean in MEANS:
                    pcts = [pct(v, mean) for v in r.values()]
                    key = "pct_of_peak_logged" + ("" if mean == "time-weighted" else "_per_line")
                    rec.update({key: pct(b, mean), f"{key}_low": min(pcts),
                                f"{key}_high": max(pcts)})
                rows.append(rec)
                brk.append(breakdown_row(f"{model} {kind} N={p.n}", b, p,
                                         extra={"eval_s": rec["eval_s"]}))
    df = pd.DataFrame(rows)
    return df, comparison(df, published), pd.DataFrame(brk)


def anchored(hw: HardwareSpec) -> list[dict]:
    """The weak and strong series anchored on the published utilisation: per model, the
    software rate at which the model's logged iteration of the published configuration gives
    its published % of peak (``anchor.solve_rate``), then every series' efficiency at its
    largest N at that rate, with the band over ``hw.scenarios()`` (the rate re-solved in
    each; a strong series' band also spans both readings of its unpublished batch), against the
    published efficiency (``error_points``: percentage points, of the central reading)."""
    from scalestudy.perf import anchor

    published = reference("frontier_dash2024")
    configs = reference("frontier_dash2024_configs")
    ratio = logged_ratio(configs)
    out = []
    for model, row in pick_configs(configs, published).items():
        pub = published[published["model"] == model].iloc[0]
        if not num(pub.get("gpus_max")):
            continue
        series = frontier_series(row, int(pub["gpus_max"]))
        p0 = series["mfu"][0]
        factor = logged_factor(row, ratio)
        hflops = flops.hardware_flops_per_step(p0.model, p0.global_batch, "megatron",
                                               p0.parallel.activation_checkpointing)
        peak = hw.peak(str(p0.train.precision))
        step0 = hflops / (float(pub["pct_of_peak"]) / 100 * p0.n * peak * factor)
        # the strong series' batch is not published: its band spans both readings
        for label, kinds, col in (("weak", ("weak",), "weak_scaling_efficiency"),
                                  ("strong", ("strong", "strong_alt"), "strong_scaling_efficiency")):
            runs = [sorted(series[k], key=lambda q: q.n) for k in kinds]
            runs = [pts for pts in runs if len(pts) >= 2]
            if not runs or not num(pub.get(col)):
                continue
            effs = {}
            for i, pts in enumerate(runs):
                for sc, h in hw.scenarios():
                    rate = anchor.solve_rate(p0, h, step0)
                    x = [anchor.per_device_rate(q, anchor.step_at_rate(q, h, rate))
                         for q in (pts[0], pts[-1])]
                    effs[(i, sc)] = (x[1] / x[0], rate)
            e, rate = effs[(0, "central")]
            pts = runs[0]
            batches = sorted({r[-1].global_batch for r in runs})
            batch = (f"global batch {pts[-1].global_batch}" if len(batches) == 1 else
                     f"global batch {batches[0]}–{batches[-1]} not published, central "
                     f"{pts[-1].global_batch}")
            out.append({"series": f"{model} {label} ({batch})",
                        "scaling": label, "metric": "pct_of_peak",
                        "n0": pts[0].n, "n": pts[-1].n, "points": len(pts), "rate": rate,
                        "published_efficiency": float(pub[col]), "predicted_efficiency": e,
                        "predicted_low": min(x[0] for x in effs.values()),
                        "predicted_high": max(x[0] for x in effs.values()),
                        "error_points": 100 * (e - float(pub[col]))})
    return out


def published_range(pub, col: str, scale: float = 1.0) -> tuple[float, float]:
    """The published value's interval from its printed resolution (``<col>_resolution``)."""
    import pandas as pd

    v = float(pub[col]) * scale
    res = pub.get(f"{col}_resolution")
    half = 0.0 if res is None or pd.isna(res) else float(res) * scale / 2
    return v - half, v + half


def comparison(df, published):
    """The predicted-vs-published table: every published figure with the predicted value,
    its range, the published interval (printed resolution) and whether the two overlap. The
    % of peak rows come in both means of the logged lines; a strong-scaling row's range spans
    both readings of its unpublished batch (``frontier_series``), its central value the
    first."""
    import pandas as pd

    comp = []
    for _, pub in published.iterrows():
        model = pub["model"]
        sub = df[df["model"] == model]
        if sub.empty:
            continue
        m = sub[sub["series"] == "mfu"].iloc[0]
        for mean in MEANS:
            key = "pct_of_peak_logged" + ("" if mean == "time-weighted" else "_per_line")
            rng = (m[f"{key}_low"], m[f"{key}_high"])
            comp.append(_cmp(model, f"% of peak (logged, HFU, {mean} mean)", m["n"], m[key], rng,
                             float(pub["pct_of_peak"]), published_range(pub, "pct_of_peak")))
        # the strong series' batch is not published: one row whose range spans both readings
        for label, kinds, col in (("weak", ("weak",), "weak_scaling_efficiency"),
                                  ("strong", ("strong", "strong_alt"), "strong_scaling_efficiency")):
            ends = [sub[sub["series"] == k].sort_values("n") for k in kinds]
            ends = [(s.iloc[0], s.iloc[-1]) for s in ends if not s.empty]
            if not ends or pd.isna(pub[col]):
                continue
            first, last = ends[0]
            rec = _cmp(model, f"{label} scaling efficiency (%), N0={first['n']}", last["n"],
                       100 * last["efficiency"],
                       (100 * min(e[1]["efficiency_low"] for e in ends),
                        100 * max(e[1]["efficiency_high"] for e in ends)),
                       100 * float(pub[col]), published_range(pub, col, 100))
            if label == "strong":
                batches = sorted({int(e[1]["global_batch"]) for e in ends})
                rec["metric"] += (f", global batch {batches[0]}–{batches[-1]} (not published; "
                                  f"central {int(last['global_batch'])})")
            comp.append(rec)
    return pd.DataFrame(comp)


def _cmp(model, metric, n, pred, rng, pub, pub_rng) -> dict:
    pred, pub = float(pred), float(pub)
    lo, hi = (float(x) for x in rng)
    return {"model": model, "metric": metric, "n": int(n), "predicted": pred,
            "predicted_low": lo, "predicted_high": hi, "published": pub,
            "published_low": pub_rng[0], "published_high": pub_rng[1],
            "rel_error": (pred - pub) / pub,
            "inside": bool(lo <= pub_rng[1] and pub_rng[0] <= hi)}
