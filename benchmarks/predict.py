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
oversubscribed and the core-sharing factor the model used), their median, minimum and
maximum, each next to its target. The targets are issue 18's for a model that has all its
inputs on the machine it runs on: **median within 0.9-1.1, every point within 0.7-1.3**
(step times of a point vary by ~±20% between runs on the shared 2-core host; a structural
error, a pass or a layer count missing, a collective dropped, moves a point by 2x).

``measure_before_run`` runs the bench's own small study (``benchmarks/before_run.yaml``:
weak-scaling DP at N = 1, 2, 4, 8) whose ``predict: {before_run: {calibrate_on_max_n: 2}}``
makes the model, calibrated on the measured N <= 2 points, predict N = 4 and 8 before they
run: target within ±25% of the measurement, and the prediction's timestamp earlier than the
point's start.

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

RATIO_RANGE = (0.7, 1.3)  # every point's predicted / measured
MEDIAN_RANGE = (0.9, 1.1)  # the median over points
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


def summarize(vm, source: str = "") -> dict:
    """The record and figures of a ``predict_vs_measured.csv`` frame (pure)."""
    points = ratios(vm)
    rs = [p["ratio"] for p in points]
    rec = {"source": source, "n_points": len(vm), "n_measured": len(points), "points": points,
           "ratio_median": statistics.median(rs) if rs else None,
           "ratio_min": min(rs) if rs else None, "ratio_max": max(rs) if rs else None}
    figs = [figure("predict", f"predicted/measured step time: {p['series']} N={p['n']}",
                   p["ratio"], "x", note=_point_note(p))
            for p in sorted(points, key=lambda p: (str(p["series"]), p["n"]))]
    lo, hi = MEDIAN_RANGE
    plo, phi = RATIO_RANGE
    note = f"{len(points)} of {len(vm)} points measured"
    figs += [
        figure("predict", "predicted/measured step time, median over points",
               rec["ratio_median"], "x", lo, ">=", f"target range {lo}-{hi}; {note}"),
        figure("predict", "predicted/measured step time, median over points (upper end)",
               rec["ratio_median"], "x", hi, "<=", f"target range {lo}-{hi}"),
        figure("predict", "predicted/measured step time, lowest point", rec["ratio_min"], "x",
               plo, ">=", f"every point within {plo}-{phi}"),
        figure("predict", "predicted/measured step time, highest point", rec["ratio_max"], "x",
               phi, "<=", f"every point within {plo}-{phi}"),
    ]
    rec["figures"] = figs
    return rec


def summarize_before_run(vm, source: str = "") -> dict:
    """Figures of the points predicted before they ran (``predicted_before_run_s`` of a
    ``predict_vs_measured.csv`` frame): per point ``|before-run residual|`` against
    ``BEFORE_RUN_ERROR`` and whether the prediction was written before the point started."""
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
                         "calibration_factor": r.get("calibration_factor"),
                         "predicted_at": r.get("predicted_at"), "started_at": r.get("started_at"),
                         "predicted_before_start": r.get("predicted_before_start")})
    figs = []
    for r in rows:
        where = f"{r['series']} N={r['n']}"
        figs.append(figure(
            "predict", f"predicted before run, |error|: {where}",
            None if r["error"] is None else abs(r["error"]), "fraction", BEFORE_RUN_ERROR, "<=",
            (f"signed {r['error']:+.1%}; " if r["error"] is not None else "")
            + f"calibrated on {r['calibrated_on']} (factor {r['calibration_factor']:.2f})"))
        before = r["predicted_before_start"]
        figs.append(figure(
            "predict", f"predicted before run, written before the point started: {where}",
            None if before is None or before != before else float(bool(before)), "bool", 1.0,
            ">=", f"predicted {r['predicted_at']}, started {r['started_at']}"))
    return {"source": source, "points": rows, "figures": figs}


def _sweep(study_file: Path, workdir: Path, timeout: float):
    """Run ``study_file`` (Snakemake, local profile) into ``workdir``/results; returns
    ``(study_dir, seconds)``."""
    from scalestudy import paths
    from scalestudy.cli import snakemake_argv
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
    own names)."""
    import tempfile

    import pandas as pd

    study_file = Path(study_file or BEFORE_RUN_STUDY).resolve()
    workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-before-run-"))
    study_dir, sweep_s = _sweep(study_file, workdir, timeout)
    csv = study_dir / "predict" / "predict_vs_measured.csv"
    rec = summarize_before_run(pd.read_csv(csv), str(csv))
    rec.update(study=str(study_file), study_dir=str(study_dir), sweep_s=sweep_s)
    return rec


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
    rec = summarize(pd.read_csv(csv), str(csv))
    rec.update(study=str(study_file), study_dir=str(study_dir), sweep_s=sweep_s,
               reused_run=sweep_s is None)
    return rec


#: One-process check of the model's arithmetic on real steps (``microbench.bench_validate``):
#: a structural error (a missing backward pass is 3x, a missing layer count 2x+) leaves this
#: band; contention noise between the building-block and the step measurements does not.
VALIDATE_RANGE = (0.4, 1.6)


def validate(cases=("tiny-b8", "small-h128")) -> dict:
    """Predicted / measured step time of one fp32 process, the model fed with building blocks
    measured in this process (matmuls at the model's shapes, attention, copy bandwidth,
    framework overhead), interleaved with the real steps so both share the host's load."""
    from scalestudy.measure import microbench

    rows = microbench.bench_validate({k: microbench.VALIDATE_CASES[k] for k in cases})
    figs = [figure("predict", f"one process, predicted/measured step time: {r['case']}",
                   r["predicted_s"] / r["measured_s"], "x", VALIDATE_RANGE[1], "<=")
            for r in rows]
    figs += [figure("predict", f"one process, predicted/measured step time: {r['case']} "
                    "(lowest accepted)", r["predicted_s"] / r["measured_s"], "x",
                    VALIDATE_RANGE[0], ">=") for r in rows]
    return {"rows": rows, "figures": figs}
