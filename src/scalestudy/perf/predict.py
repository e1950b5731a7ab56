"""``scalestudy predict``: predicted MFU and weak/strong scaling efficiency at real scale,
next to published results, with the relative error of each.

    scalestudy predict [STUDY.yaml] [--hardware frontier] [--out DIR] [--runs runs.csv]
        [--matmul-csv M.csv] [--collectives-csv C.csv] [--dp-overlap F]

With a study file, every feasible point of the study is predicted on ``--hardware``
(default: ``cpu-local`` for a CPU study; building blocks measured by the study's
``microbench`` jobs, else the matmul ceiling of its ``calibration.json``, are used when
present and no ``--hardware`` is named) and, where the
study has been run (``results/<study>/runs.csv``), set against the measured step time with
the residual ``(predicted - measured) / measured``: ``study_predictions.csv``,
``predict_vs_measured.csv`` and ``predict_vs_measured.png``.

Without a study, or when the study lists ``references: [frontier_dash2024]``, the published
comparison is made at real scale on ``--hardware`` (default ``frontier``). The points at scale are the Frontier study's configurations (reference data
``frontier_dash2024_configs``; per model the launch script with the published sequence
length, preferring FlashAttention-2): the model-parallel shape (tp, pp, micro-batch, ZeRO
stage, checkpointing) is kept and data parallelism grows from the script's GCD count to the
paper's largest (weak: global batch ∝ dp; strong: global batch fixed, rounded to a multiple
of every dp × micro-batch of the series). A study file may instead list the points under
``predict: {points: [...]}`` (resolved points, docs/architecture.md).

Published "% of peak" was logged by Megatron-DeepSpeed's counter, which counts the
checkpointing recompute; it is compared with the predicted *HFU* (recompute counted) when
the configuration checkpoints, with MFU otherwise. Efficiencies are relative to the smallest
N of the series: weak ``T(N0)/T(N)``, strong ``T(N0)·N0/(T(N)·N)``.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

from scalestudy.analysis.efficiency import per_device_throughput
from scalestudy.config.point import Model, Parallel, Platform, Point, Train
from scalestudy.perf import stepmodel as perfmodel

MODELS = ("gpt-22b", "gpt-175b", "gpt-1t")
#: DeepSpeed's ZeRO stage -> the data-parallel mode that holds the same state per device.
ZERO_STAGE_DP_MODE = {0: "ddp", 1: "zero1", 2: "fsdp_grad_op", 3: "fsdp"}


def reference(name: str):
    """A published reference table as a DataFrame (``scalestudy.references.load``)."""
    from scalestudy.report.references import load

    return load(name)


def config_point(row, dp: int, global_batch: int, mode: str = "strong") -> Point:
    """The point of a row of ``frontier_dash2024_configs`` at data parallelism ``dp`` and
    ``global_batch``: Megatron-DeepSpeed's GPT (GELU 4h, biases, tied embeddings), bf16,
    the row's ZeRO stage and checkpointing, FlashAttention unless the row says none."""
    tp, pp, mb = int(row["tp"]), int(row["pp"]), int(row["micro_batch"])
    if global_batch % (dp * mb):
        raise ValueError(f"global_batch={global_batch} is not a multiple of dp·micro_batch={dp * mb}")
    zs = row.get("zero_stage")
    zs = 0 if zs is None or (isinstance(zs, float) and math.isnan(zs)) else int(zs)
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
    """Per model, the launch-script row whose sequence length matches the published one,
    preferring FlashAttention-2, then the later script (the later row of the table)."""
    out = {}
    for model in MODELS:
        pub = published[published["model"] == model]
        rows = configs[configs["model"] == model]
        if rows.empty or pub.empty:
            continue
        s = int(pub.iloc[0]["seq_len"])
        same = rows[rows["seq_len"] == s]
        rows = same if not same.empty else rows
        fa2 = rows[rows["flash_attention"].astype(str) == "v2"]
        out[model] = (fa2 if not fa2.empty else rows).iloc[-1]
    return out


def series_points(row, n_max: int | None) -> dict[str, list[Point]]:
    """``{"mfu": [point], "weak": [...], "strong": [...]}`` for one configuration row."""
    tp, pp, dp0, mb = int(row["tp"]), int(row["pp"]), int(row["dp"]), int(row["micro_batch"])
    gb0 = int(row["global_batch"])
    n0 = tp * pp * dp0
    out = {"mfu": [config_point(row, dp0, gb0)], "weak": [], "strong": []}
    if not n_max or n_max <= n0:
        return out
    # dp grows by doubling while it fits, and the published maximum is always included
    dps, d = [], dp0
    while tp * pp * d < n_max:
        dps.append(d)
        d *= 2
    dps = [x for x in dps if tp * pp * x < n_max] + [n_max // (tp * pp)]
    if len(dps) < 2:
        return out
    lcm = mb
    for x in dps:
        lcm = lcm * x * mb // math.gcd(lcm, x * mb)
    gb_strong = max(lcm, round(gb0 / lcm) * lcm)
    out["weak"] = [config_point(row, x, gb0 * x // dp0, "weak") for x in dps
                   if (gb0 * x) % dp0 == 0]
    out["strong"] = [config_point(row, x, gb_strong) for x in dps]
    return out


def run(hw: perfmodel.HardwareSpec, measured: perfmodel.Measured | None = None,
        dp_overlap: float | None = None, points: list[Point] | None = None):
    """Predictions for every series point and the comparison table. Returns
    ``(points_df, comparison_df)``."""
    import pandas as pd

    published = reference("frontier_dash2024")
    rows = []
    if points is None:
        configs = reference("frontier_dash2024_configs")
        chosen = pick_configs(configs, published)
        series = {}
        for model, row in chosen.items():
            pub = published[published["model"] == model].iloc[0]
            n_max = None if pd.isna(pub["gpus_max"]) else int(pub["gpus_max"])
            series[model] = series_points(row, n_max)
    else:
        series = {}
        for p in points:
            series.setdefault(p.model.name, {}).setdefault(p.mode, []).append(p)
    for model, by_kind in series.items():
        for kind, pts in by_kind.items():
            x0 = None
            for p in sorted(pts, key=lambda q: q.n):
                r = perfmodel.predict_step_time(p, hw, measured, dp_overlap)
                x = per_device_throughput(p.tokens_per_step, r["step_time_s"], p.n)
                x0 = x if x0 is None else x0
                eff = x / x0
                ckpt = p.parallel.activation_checkpointing
                rows.append({
                    "model": model, "series": kind, "n": p.n, "tp": p.tp, "pp": p.pp,
                    "dp": p.dp, "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
                    "global_batch": p.global_batch, "seq_len": p.seq_len,
                    "dp_mode": p.parallel.dp_mode, "activation_checkpointing": ckpt,
                    **{k: v for k, v in r.items() if isinstance(v, (int, float, str))},
                    "pct_of_peak_logged": 100 * (r["hfu"] if ckpt != "none" else r["mfu"]),
                    "efficiency": eff,
                })
    df = pd.DataFrame(rows)
    comp = []
    for _, pub in published.iterrows():
        model = pub["model"]
        sub = df[df["model"] == model]
        if sub.empty:
            continue
        m = sub[sub["series"] == "mfu"].iloc[0]
        comp.append(_cmp(model, "% of peak (logged, HFU)", m["n"], m["pct_of_peak_logged"], pub["pct_of_peak"]))
        comp.append(_cmp(model, "TFLOPS per GCD", m["n"], m["tflops_per_device"], pub["tflops_per_device"]))
        for kind, col in (("weak", "weak_scaling_efficiency"), ("strong", "strong_scaling_efficiency")):
            s = sub[sub["series"] == kind]
            if s.empty or pd.isna(pub[col]):
                continue
            last = s.sort_values("n").iloc[-1]
            first = s.sort_values("n").iloc[0]
            comp.append(_cmp(model, f"{kind} scaling efficiency (%), N0={first['n']}", last["n"],
                             100 * last["efficiency"], 100 * float(pub[col])))
    return df, pd.DataFrame(comp)


def _cmp(model, metric, n, pred, pub) -> dict:
    pred, pub = float(pred), float(pub)
    return {"model": model, "metric": metric, "n": int(n), "predicted": pred, "published": pub,
            "rel_error": (pred - pub) / pub}


def markdown(comp, hw: perfmodel.HardwareSpec) -> str:
    lines = [
        f"# Predicted vs published (Dash et al. 2024, Frontier) on hardware `{hw.name}`",
        "",
        "| model | metric | N (GCDs) | predicted | published | rel. error |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in comp.itertuples():
        lines.append(f"| {r.model} | {r.metric} | {r.n} | {r.predicted:.2f} | {r.published:.2f} "
                     f"| {r.rel_error:+.1%} |")
    lines += ["", f"Matmul efficiency {hw.matmul_efficiency:.2f} of peak ({hw.source}); "
              "no parameter is fitted to the published results."]
    return "\n".join(lines) + "\n"


def figures(df, comp, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6, 4))
    c = comp[comp["metric"].str.startswith("% of peak")]
    x = range(len(c))
    ax.bar([i - 0.2 for i in x], c["predicted"], width=0.4, label="predicted")
    ax.bar([i + 0.2 for i in x], c["published"], width=0.4, label="published")
    ax.set_xticks(list(x), c["model"])
    ax.set_ylabel("% of 191.5 TFLOPS (recompute counted)")
    ax.set_title("Per-GCD utilisation: model vs Dash et al. 2024")
    ax.legend()
    fig.tight_layout()
    p = out / "predict_mfu.png"
    paths.append(_save(fig, p))

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, kind in zip(axes, ("weak", "strong")):
        s = df[df["series"] == kind]
        for model, g in s.groupby("model"):
            line, = ax.plot(g["n"], 100 * g["efficiency"], marker="o", label=f"{model} predicted")
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
    p = out / "predict_scaling.png"
    paths.append(_save(fig, p))
    return paths


def study_predictions(points: list[Point], hw: perfmodel.HardwareSpec,
                      measured: perfmodel.Measured | None = None,
                      dp_overlap: float | None = None):
    """Predicted step time, throughput, MFU and efficiency (vs each series' ``baseline_n``)
    of the feasible points of a planned study (one row per config, repeats collapsed)."""
    import pandas as pd

    rows, seen = [], set()
    for p in points:
        if not p.feasible or p.config_hash in seen:
            continue
        seen.add(p.config_hash)
        r = perfmodel.predict_step_time(p, hw, measured, dp_overlap)
        rows.append({"series": p.series, "mode": p.mode, "n": p.n, "dp": p.dp, "tp": p.tp,
                     "pp": p.pp, "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
                     "global_batch": p.global_batch, "config_hash": p.config_hash,
                     "baseline_n": p.baseline_n, "model": p.model.name,
                     **{k: v for k, v in r.items() if isinstance(v, (int, float, str))}})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    x = per_device_throughput(df["tokens_per_step"], df["step_time_s"], df["n"])
    base = {(r.series, r.n): xi for r, xi in zip(df.itertuples(), x)}
    df["predicted_efficiency"] = [xi / base.get((r.series, r.baseline_n), float("nan"))
                                  for r, xi in zip(df.itertuples(), x)]
    return df


def versus_measured(pred, runs):
    """Predicted vs measured step time per config: ``measured_step_time_s`` (median over the
    ok repeats of each run's median), ``residual = (predicted - measured) / measured``."""
    ok = runs[runs["status"] == "ok"]
    meas = ok.groupby("config_hash", as_index=False)["step_time_median_s"].median()
    meas = meas.rename(columns={"step_time_median_s": "measured_step_time_s"})
    out = pred.merge(meas, on="config_hash", how="left")
    out["residual"] = (out["step_time_s"] - out["measured_step_time_s"]) / out["measured_step_time_s"]
    return out


def _save(fig, path: Path) -> Path:
    """Write a matplotlib figure atomically and close it."""
    import matplotlib.pyplot as plt

    from scalestudy.record.io import atomic_path

    with atomic_path(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)
    return path


def residual_figure(df, path: Path) -> Path:
    """Step time predicted (lines) and measured (markers) vs N per series, and the residual."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axr) = plt.subplots(2, 1, figsize=(6.5, 6), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    for series, g in df.sort_values("n").groupby("series"):
        line, = ax.plot(g["n"], g["step_time_s"], "--", label=f"{series} predicted")
        ax.plot(g["n"], g["measured_step_time_s"], "o", color=line.get_color(),
                label=f"{series} measured")
        axr.plot(g["n"], 100 * g["residual"], "o-", color=line.get_color())
    ax.set_ylabel("step time (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("Performance model vs measurement")
    axr.axhline(0, color="grey", lw=0.8)
    axr.set_ylabel("residual (%)")
    axr.set_xlabel("N (devices)")
    axr.set_xscale("log", base=2)
    fig.tight_layout()
    return _save(fig, path)


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
    ap.add_argument("--results", default="results", help="results root (default results/)")
    ap.add_argument("--out", default=None, help="output folder (default <results>/<study>/predict)")
    ap.add_argument("--runs", default=None, help="runs.csv to compare with (default <results>/<study>/runs.csv)")
    ap.add_argument("--matmul-csv", help="microbench matmul CSV measured on that hardware")
    ap.add_argument("--collectives-csv", help="microbench collectives CSV measured on that hardware")
    ap.add_argument("--dp-overlap", type=float, default=None)
    a = ap.parse_args(argv)

    import pandas as pd

    from scalestudy.record.io import write_text

    explicit = None
    if a.matmul_csv or a.collectives_csv:
        explicit = perfmodel.Measured.from_csv(a.matmul_csv, a.collectives_csv)
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
            hw, measured = perfmodel.HardwareSpec.load(a.hardware), explicit
        elif device in ("cpu", "auto"):
            mb = Path(a.results) / name / "microbench"
            hw = perfmodel.HardwareSpec.load("cpu-local")
            measured = explicit or perfmodel.Measured.from_csv(
                *(str(mb / f) if (mb / f).exists() else None
                  for f in ("matmul.csv", "collectives.csv")))
            cal = Path(a.results) / name / "calibration.json"
            if not measured.matmul and cal.exists():
                # the ceiling measured during the study's own run: the host's load then
                measured = replace(measured, matmul=perfmodel.Measured.from_calibration(cal).matmul)
        else:
            print("scalestudy predict: --hardware is required for a GPU study (a preset such as "
                  f"{', '.join(perfmodel.presets())} or a YAML path)", file=sys.stderr)
            return 2
        pred = study_predictions(plan_points(study), hw, measured, a.dp_overlap)
        _write_csv(pred, out / "study_predictions.csv")
        runs_path = Path(a.runs or f"{a.results}/{name}/runs.csv")
        if runs_path.exists() and not pred.empty:
            vm = versus_measured(pred, pd.read_csv(runs_path))
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
        hw = perfmodel.HardwareSpec.load(a.hardware or "frontier")
        df, comp = run(hw, explicit, a.dp_overlap)
        _write_csv(df, out / "predict_points.csv")
        _write_csv(comp, out / "predict_vs_published.csv")
        md = markdown(comp, hw)
        write_text(out / "predict_vs_published.md", md)
        figures(df, comp, out)
        print(md)
    print(f"-> {out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
