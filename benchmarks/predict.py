"""The performance model against measurement: predicted / measured step time per point.

Runs a study (default: ``workflow/config/default.yaml``, 10 points: DP, TP, PP, N = 1, 2, 4
on gloo) through the pipeline, or reads a study directory that has been run already (the
``harness`` benchmark's, when both run in one ``python -m benchmarks`` call), and reads its
``predict`` job's ``predict/predict_vs_measured.csv``: each measured step time set against the
model's prediction from the building blocks measured during that same run (the calibrate job:
the study's own model timed piece by piece at its micro-batch shapes, the cost of sharing the
cores at the study's process counts; the microbench job's collectives) and the ``cpu-local``
preset.

Figures: the ratio predicted / measured of every point (with whether the host was
oversubscribed and the core-sharing factor the model used) and the lowest and highest of
them, as information without a target; their median against the target for a model that has
all its inputs on the machine it runs on, **median within 0.9-1.1** (``MEDIAN_RANGE``). A
structural error (a pass or a layer count missing, a collective dropped) moves a point by 2x.

Beside the ratios, the host's own run-to-run noise, in the same units (slowest / fastest):
the spread of one point's repeats in the study's ``runs.csv`` (the study runs every point
``repeats`` times, each in processes of its own), per point ``max / min`` of the repeats' step
times, summarised as the median and the maximum over points (``repeat_noise``); and the
spread of one fixed fp32 matmul timed ``MATMUL_NOISE_SAMPLES`` times in the bench's own
process (``matmul_noise``). Each target is read against that noise: no point has a target of
its own (a single point's ratio moves between runs by its repeats' spread), and the noise
figure's note says that no target is tighter than the noise, or, where the median point's
spread is wider than the median target's band, that it is.

``measure_before_run`` runs the bench's own small study (``benchmarks/before_run.yaml``:
weak-scaling DP at N = 1, 2, 4, 8) whose ``predict: {before_run: {calibrate_on_max_n: 2}}``
makes the model, calibrated on the measured N <= 2 points, predict N = 4 and 8 before they
run: target within ±25% of the measurement (``BEFORE_RUN_ERROR``), printed next to that
study's own repeat noise, and the prediction's timestamp earlier than the point's start.

Timing means little on an oversubscribed host: the load average is recorded beside every
figure (``python -m benchmarks``) and in the calibration (``slices``: each slice's
``load_1m``).
"""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from benchmarks import figure

MEDIAN_RANGE = (0.9, 1.1)  # the median over points of predicted / measured
MATMUL_NOISE_SHAPE = (256, 256, 256)  # the fixed product of ``matmul_noise`` (fp32)
MATMUL_NOISE_SAMPLES = 15
BEFORE_RUN_ERROR = 0.25  # |predicted before run - measured| / measured, N = 4 and 8
BEFORE_RUN_STUDY = Path(__file__).with_name("before_run.yaml")


def ratios(vm) -> list[dict]:
    """Per point of a ``predict_vs_measured.csv`` frame with a measurement: ``series, n,
    config_hash, predicted_s, measured_s, ratio`` (predicted / measured), ``oversubscribed``
    and ``core_sharing_slowdown`` where the frame has them."""
    out = []
    for r in vm.to_dict("records"):
        pred, meas = r.get("step_time_s"), r.get("measured_step_time_s")
        if pred is None or meas is None or not meas == meas or not pred == pred or meas <= 0:
            continue  # not measured (NaN) or no prediction
        out.append({"series": r.get("series"), "n": int(r["n"]),
                    "config_hash": r.get("config_hash"), "predicted_s": float(pred),
                    "measured_s": float(meas), "ratio": float(pred) / float(meas),
                    "oversubscribed": r.get("oversubscribed"),
                    "core_sharing_slowdown": r.get("core_sharing_slowdown")})
    return out


def _point_note(p: dict) -> str:
    note = (f"predicted {p['predicted_s'] * 1e3:.1f} ms, measured {p['measured_s'] * 1e3:.1f} ms")
    f = p.get("core_sharing_slowdown")
    if f is not None and f == f:
        note += (f"; {'oversubscribed' if p.get('oversubscribed') else 'not oversubscribed'}, "
                 f"core-sharing factor {f:.2f}")
    return note


def repeat_noise(runs) -> dict:
    """The host's run-to-run noise in a study's ``runs.csv`` frame: per point (``config_hash``)
    with at least two ok repeats, ``spread``: the slowest repeat's ``step_time_median_s`` over
    the fastest's (1.0: identical), and ``cv``: their coefficient of variation (population
    standard deviation / mean); summarised as ``spread_median``, ``spread_max`` and
    ``cv_median`` over those points (None without any). Pure."""
    points = []
    if runs is not None and {"config_hash", "step_time_median_s"} <= set(runs.columns):
        ok = runs[runs["status"] == "ok"] if "status" in runs else runs
        for h, g in ok.groupby("config_hash", sort=True):
            ts = [float(x) for x in g["step_time_median_s"] if x == x and x > 0]
            if len(ts) < 2:
                continue
            mean = statistics.fmean(ts)
            first, n = g.iloc[0], g.iloc[0].get("n")
            points.append({"config_hash": h, "series": first.get("series"),
                           "n": int(n) if n is not None and n == n else None,
                           "repeats": len(ts), "spread": max(ts) / min(ts),
                           "cv": statistics.pstdev(ts) / mean})
    spreads = [p["spread"] for p in points]
    return {"points": points, "n_points": len(points),
            "spread_median": statistics.median(spreads) if spreads else None,
            "spread_max": max(spreads) if spreads else None,
            "cv_median": statistics.median(p["cv"] for p in points) if points else None}


def _pct(spread) -> str:
    return "n/a" if spread is None else f"{100 * (spread - 1):.0f}%"


def noise_figures(noise: dict, label: str, target_halfwidth: float, target: str) -> list[dict]:
    """Figures (no target) of ``repeat_noise``'s summary, and a note that compares it with the
    band of the target read next to it (``target``, half-width ``target_halfwidth``: 0.1 for
    0.9-1.1)."""
    med, top = noise["spread_median"], noise["spread_max"]
    where = (f"{noise['n_points']} points with 2+ ok repeats in runs.csv" if noise["n_points"]
             else "no point with 2+ ok repeats in runs.csv")
    says = f"repeats of one point differ by {_pct(med)} median, {_pct(top)} max ({where}"
    says += "" if noise["cv_median"] is None else f"; CV {100 * noise['cv_median']:.0f}% median"
    says += ")"
    if med is None:
        verdict = f"noise not measured; {target}"
    elif med - 1 > target_halfwidth:
        verdict = (f"the target ({target}) is narrower than the median point's repeat spread: "
                   "read its verdict with this noise")
    else:
        verdict = f"no target is tighter than this noise ({target})"
    return [
        figure("predict", f"host noise{label}: one point's repeats, slowest/fastest, median "
               "over points", med, "x", note=f"{says}; {verdict}"),
        figure("predict", f"host noise{label}: one point's repeats, slowest/fastest, largest",
               top, "x", note="a single point's ratio moves by up to this between runs"),
    ]


def matmul_noise(shape=MATMUL_NOISE_SHAPE, samples: int = MATMUL_NOISE_SAMPLES) -> dict:
    """The host's noise on one fixed fp32 matmul timed ``samples`` times in this process (each
    sample repeats it for 20 ms): ``spread`` slowest / fastest sample, ``cv``, and a figure
    (no target) in the ratios' units."""
    from scalestudy.measure.matmul import bench_matmul

    secs = [r["seconds"] for r in bench_matmul([tuple(shape)], ["fp32"], "cpu",
                                               samples=samples, min_time_s=0.02)]
    spread = max(secs) / min(secs) if secs else None
    cv = statistics.pstdev(secs) / statistics.fmean(secs) if secs else None
    m, n, k = shape
    note = (f"{len(secs)} timings of one {m}x{n}x{k} fp32 matmul in this process differ by "
            f"{_pct(spread)}" + ("" if cv is None else f" (CV {100 * cv:.1f}%)")
            + "; this host's noise within seconds (each timing repeats it for 20 ms)")
    return {"shape": list(shape), "seconds": secs, "spread": spread, "cv": cv,
            "figures": [figure("predict", "host noise: one fixed matmul, slowest/fastest of "
                               f"{len(secs)} timings", spread, "x", note=note)]}


def summarize(vm, source: str = "", runs=None) -> dict:
    """The record and figures of a ``predict_vs_measured.csv`` frame (pure): every point's
    ratio, their lowest and highest (information), their median against ``MEDIAN_RANGE``, and
    the repeat noise of ``runs`` (the study's ``runs.csv`` frame; None: not measured)."""
    points = ratios(vm)
    rs = [p["ratio"] for p in points]
    noise = repeat_noise(runs)
    rec = {"source": source, "n_points": len(vm), "n_measured": len(points), "points": points,
           "ratio_median": statistics.median(rs) if rs else None,
           "ratio_min": min(rs) if rs else None, "ratio_max": max(rs) if rs else None,
           "noise": noise}
    figs = [figure("predict", f"predicted/measured step time: {p['series']} N={p['n']}",
                   p["ratio"], "x", note=_point_note(p))
            for p in sorted(points, key=lambda p: (str(p["series"]), p["n"]))]
    lo, hi = MEDIAN_RANGE
    note = f"{len(points)} of {len(vm)} points measured"
    figs += [
        figure("predict", "predicted/measured step time, lowest point", rec["ratio_min"], "x",
               note="information, no target: one point moves with the host noise below"),
        figure("predict", "predicted/measured step time, highest point", rec["ratio_max"], "x",
               note="information, no target: one point moves with the host noise below"),
        figure("predict", "predicted/measured step time, median over points",
               rec["ratio_median"], "x", lo, ">=", f"target range {lo}-{hi}; {note}"),
        figure("predict", "predicted/measured step time, median over points (upper end)",
               rec["ratio_median"], "x", hi, "<=", f"target range {lo}-{hi}"),
    ]
    figs += noise_figures(noise, "", (hi - lo) / 2,
                          f"median over points within {lo}-{hi}; no per-point target")
    rec["figures"] = figs
    return rec


def _read_runs(study_dir):
    """The study's ``runs.csv`` frame, or None where it is not there."""
    import pandas as pd

    path = Path(study_dir) / "runs.csv"
    return pd.read_csv(path) if path.exists() else None


def summarize_before_run(vm, source: str = "", runs=None) -> dict:
    """Figures of the points predicted before they ran (``predicted_before_run_s`` of a
    ``predict_vs_measured.csv`` frame): per point ``|before-run residual|`` against
    ``BEFORE_RUN_ERROR`` and whether the prediction was written before the point started;
    with ``runs`` (that study's ``runs.csv`` frame) its repeat noise beside them."""
    rows = []
    if "predicted_before_run_s" in vm:
        for r in vm[vm["predicted_before_run_s"].notna()].sort_values("n").to_dict("records"):
            meas = r.get("measured_step_time_s")
            err = ((r["predicted_before_run_s"] - meas) / meas
                   if meas is not None and meas == meas and meas > 0 else None)
            rows.append({"series": r.get("series"), "n": int(r["n"]),
                         "predicted_before_run_s": float(r["predicted_before_run_s"]),
                         "measured_s": meas, "error": err,
                         "calibrated_on": r.get("calibrated_on"),
                         "software_rate": r.get("software_rate", r.get("calibration_factor")),
                         "predicted_at": r.get("predicted_at"), "started_at": r.get("started_at"),
                         "predicted_before_start": r.get("predicted_before_start")})
    figs = []
    for r in rows:
        where = f"{r['series']} N={r['n']}"
        figs.append(figure(
            "predict", f"predicted before run, |error|: {where}",
            None if r["error"] is None else abs(r["error"]), "fraction", BEFORE_RUN_ERROR, "<=",
            (f"signed {r['error']:+.1%}; " if r["error"] is not None else "")
            + f"anchored on {r['calibrated_on']} (software rate {r['software_rate']:.2f})"))
        before = r["predicted_before_start"]
        figs.append(figure(
            "predict", f"predicted before run, written before the point started: {where}",
            None if before is None or before != before else float(bool(before)), "bool", 1.0,
            ">=", f"predicted {r['predicted_at']}, started {r['started_at']}"))
    noise = None
    if runs is not None:
        noise = repeat_noise(runs)
        figs += noise_figures(noise, " (before-run study)", BEFORE_RUN_ERROR,
                              f"every predicted point within ±{BEFORE_RUN_ERROR:.0%}")
    return {"source": source, "points": rows, "figures": figs, "noise": noise}


def _sweep(study_file: Path, workdir: Path, timeout: float):
    """Run ``study_file`` (Snakemake, local profile) into ``workdir``/results; returns
    ``(study_dir, seconds)``."""
    from scalestudy import paths
    from scalestudy.run.snakemake import snakemake_argv
    from scalestudy.config.study import load_study

    study = load_study(study_file)
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results"
    t0 = time.monotonic()
    with open(workdir / "sweep.log", "w") as log:
        rc = subprocess.run(snakemake_argv(str(study_file), str(results),
                                           str(paths.profile("local")), []),
                            stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise RuntimeError(f"the sweep failed (exit {rc}); see {workdir / 'sweep.log'}")
    return results / study.name, time.monotonic() - t0


def measure_before_run(workdir: str | Path | None = None, study_file: str | Path | None = None,
                       timeout: float = 1800) -> dict:
    """Run the before-run study (``BEFORE_RUN_STUDY``) and return ``summarize_before_run`` of
    its ``predict_vs_measured.csv`` (with the in-sample figures of ``summarize`` under their
    own names), and per point predicted before it ran the anchored efficiency curve
    (``before_run_efficiency``: its efficiency with its band, information without a
    target, beside the measured efficiency, the step's error and the study's repeat noise),
    printed to stderr."""
    import sys
    import tempfile

    import pandas as pd

    study_file = Path(study_file or BEFORE_RUN_STUDY).resolve()
    workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-before-run-"))
    study_dir, sweep_s = _sweep(study_file, workdir, timeout)
    csv = study_dir / "predict" / "predict_vs_measured.csv"
    vm = pd.read_csv(csv)
    rec = summarize_before_run(vm, str(csv), _read_runs(study_dir))
    eff = before_run_efficiency(vm, rec["points"], rec["noise"])
    rec["figures"] += eff["figures"]
    rec.update(study=str(study_file), study_dir=str(study_dir), sweep_s=sweep_s,
               efficiency=eff["rows"])
    print(eff["text"], file=sys.stderr, flush=True)
    return rec


def before_run_efficiency(vm, points: list[dict], noise: dict | None) -> dict:
    """The anchored efficiency predicted before the run (``predicted_efficiency_before_run``
    and its ``_low``/``_high`` of a ``predict_vs_measured.csv`` frame) at each point of
    ``points`` (``summarize_before_run``'s), beside its ``measured_efficiency``, the step's
    error and the repeat ``noise``: ``rows``, ``figures`` (information, no target: the
    step's ±``BEFORE_RUN_ERROR`` is the target, the host noise bounds anything tighter) and
    ``text`` (a table, one line per point). Pure."""
    import math

    def num(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    def pct(x):
        return "n/a" if x is None else f"{x:.1%}"

    by = {(r.get("series"), int(r["n"])): r for r in vm.to_dict("records")}
    med = (noise or {}).get("spread_median")
    top = (noise or {}).get("spread_max")
    says = (f"host noise (before-run study): repeats differ by {_pct(med)} median, "
            f"{_pct(top)} max")
    rows, figs = [], []
    lines = ["before-run: anchored efficiency vs measured (" + says + ")",
             f"  {'series':<12} {'N':>3}  {'predicted E [band]':<28} {'measured E':>10}  "
             "step error"]
    for p in points:
        r = by.get((p["series"], p["n"]), {})
        e, lo, hi = (num(r.get(f"predicted_efficiency_before_run{s}")) for s in ("", "_low",
                                                                                   "_high"))
        row = {"series": p["series"], "n": p["n"], "predicted_efficiency": e,
               "predicted_efficiency_low": lo, "predicted_efficiency_high": hi,
               "measured_efficiency": num(r.get("measured_efficiency")), "step_error": p["error"],
               "noise_spread_median": med}
        rows.append(row)
        band = "" if lo is None else f" [{pct(lo)}, {pct(hi)}]"
        err = "n/a" if p["error"] is None else f"{p['error']:+.1%}"
        lines.append(f"  {str(p['series']):<12} {p['n']:>3}  {pct(e) + band:<28} "
                     f"{pct(row['measured_efficiency']):>10}  {err}")
        figs.append(figure(
            "predict", f"predicted before run, efficiency (anchored): {p['series']} N={p['n']}",
            e, "fraction",
            note=(f"band {pct(lo)}-{pct(hi)}; measured {pct(row['measured_efficiency'])}; "
                  f"step error {err} (target ±{BEFORE_RUN_ERROR:.0%}); {says}; no target "
                  "of its own: the host noise bounds it")))
    return {"rows": rows, "figures": figs, "text": "\n".join(lines)}


def measure(study_file: str | Path | None = None, workdir: str | Path | None = None, *,
            study_dir: str | Path | None = None, timeout: float = 1800) -> dict:
    """The figures of a run study: ``study_dir`` (``RESULTS/<study>``) when given and its
    ``predict/predict_vs_measured.csv`` exists, else the study is run (Snakemake, local
    profile) into ``workdir``/results first. Returns the record."""
    import tempfile

    import pandas as pd

    from scalestudy import paths

    study_file = Path(study_file or paths.workflow_dir() / "config" / "default.yaml").resolve()
    csv = Path(study_dir) / "predict" / "predict_vs_measured.csv" if study_dir else None
    sweep_s = None
    if csv is None or not csv.exists():
        workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-predict-"))
        study_dir, sweep_s = _sweep(study_file, workdir, timeout)
        csv = study_dir / "predict" / "predict_vs_measured.csv"
        if not csv.exists():
            raise FileNotFoundError(f"{csv}: the study has no predict job output (a CPU study "
                                    "runs `predict`; a GPU study needs scalestudy predict "
                                    "--hardware H)")
    rec = summarize(pd.read_csv(csv), str(csv), _read_runs(csv.parent.parent))
    rec.update(study=str(study_file), study_dir=str(study_dir), sweep_s=sweep_s,
               reused_run=sweep_s is None)
    return rec


#: One-process check of the model's arithmetic on real steps
#: (``scalestudy.measure.validate.bench_validate``):
#: a structural error (a missing backward pass is 3x, a missing layer count 2x+) leaves this
#: band; contention noise between the building-block and the step measurements does not.
VALIDATE_RANGE = (0.4, 1.6)


def validate(cases=("tiny-b8", "small-h128")) -> dict:
    """Predicted / measured step time of one fp32 process, the model fed with building blocks
    measured in this process (matmuls at the model's shapes, attention, copy bandwidth,
    framework overhead), interleaved with the real steps so both share the host's load."""
    from scalestudy.measure.validate import VALIDATE_CASES, bench_validate

    rows = bench_validate({k: VALIDATE_CASES[k] for k in cases})
    figs = [figure("predict", f"one process, predicted/measured step time: {r['case']}",
                   r["predicted_s"] / r["measured_s"], "x", VALIDATE_RANGE[1], "<=")
            for r in rows]
    figs += [figure("predict", f"one process, predicted/measured step time: {r['case']} "
                    "(lowest accepted)", r["predicted_s"] / r["measured_s"], "x",
                    VALIDATE_RANGE[0], ">=") for r in rows]
    return {"rows": rows, "figures": figs}
