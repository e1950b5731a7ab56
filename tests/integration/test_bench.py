"""The benchmarks (top-level ``benchmarks/``, ``python -m benchmarks``) produce complete,
well-formed records (no timing is asserted here: the figures themselves are read in
``make bench``)."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import __main__ as bench
from benchmarks import figure, gpu, harness, predict, scale, trainer
from scalestudy.config.point import Point

REPO = Path(__file__).resolve().parents[2]
FIGURE_KEYS = {"benchmark", "figure", "value", "unit", "target", "op", "met", "note"}


def _well_formed(figs: list[dict], benchmark: str) -> None:
    assert figs
    for f in figs:
        assert set(f) == FIGURE_KEYS, f
        assert f["benchmark"] == benchmark and f["figure"]
        if f["target"] is not None:
            assert f["op"] in ("<=", ">=")
            if f["value"] is not None:
                assert f["met"] == (f["value"] <= f["target"] if f["op"] == "<="
                                    else f["value"] >= f["target"])


def test_figure_verdict_and_table():
    assert figure("x", "a", 0.04, "fraction", 0.05, "<=")["met"] is True
    assert figure("x", "a", 0.5, "fraction", 0.5, ">=")["met"] is True
    assert figure("x", "a", 0.49, "fraction", 0.5, ">=")["met"] is False
    assert figure("x", "a", None, "fraction", 0.5, ">=")["met"] is None
    md = bench.table([figure("x", "overhead", -0.012, "fraction", 0.05, "<=")])
    assert "| x | overhead | -1.2% | <= 5.0% | yes |" in md


def test_python_dash_m_benchmarks_from_the_repository_root():
    p = subprocess.run([sys.executable, "-m", "benchmarks", "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "python -m benchmarks" in p.stdout and "predict" in p.stdout
    bad = subprocess.run([sys.executable, "-m", "benchmarks", "nope"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown benchmark 'nope'" in bad.stderr
    assert set(bench.NAMES) == {"trainer", "harness", "scale", "gpu", "predict", "foreign",
                               "tune"}


def _vm_frame() -> pd.DataFrame:
    """A predict_vs_measured.csv as the predict job writes it (one point not measured)."""
    return pd.DataFrame({
        "series": ["weak", "weak", "strong", "strong"], "n": [1, 2, 1, 2],
        "config_hash": ["a", "b", "c", "d"], "step_time_s": [0.05, 0.08, 0.2, 0.3],
        "measured_step_time_s": [0.1, 0.1, 0.25, float("nan")]})


def _runs_frame() -> pd.DataFrame:
    """runs.csv rows: a's three ok repeats spread 1.2x, b's two 1.05x, c's two ok 1.02x (its
    failed third is left out), d's only repeat failed (no spread)."""
    return pd.DataFrame({
        "config_hash": ["a", "a", "a", "b", "b", "c", "c", "c", "d"],
        "series": ["weak"] * 5 + ["strong"] * 4, "n": [1, 1, 1, 2, 2, 1, 1, 1, 2],
        "repeat": [0, 1, 2, 0, 1, 0, 1, 2, 0],
        "status": ["ok"] * 7 + ["failed"] * 2,
        "step_time_median_s": [0.10, 0.12, 0.11, 0.20, 0.21, 0.25, 0.255, float("nan"),
                               float("nan")]})


def test_repeat_noise_and_its_note():
    noise = predict.repeat_noise(_runs_frame())
    assert [(p["config_hash"], p["repeats"]) for p in noise["points"]] == [
        ("a", 3), ("b", 2), ("c", 2)]
    assert noise["spread_max"] == pytest.approx(1.2)
    assert noise["spread_median"] == pytest.approx(1.05)
    a = [0.10, 0.12, 0.11]
    assert noise["points"][0]["cv"] == pytest.approx(pd.Series(a).std(ddof=0) / 0.11)
    none = predict.repeat_noise(None)
    assert none["n_points"] == 0 and none["spread_median"] is None
    figs = predict.noise_figures(none, "", 0.1, "median within 0.9-1.1")
    _well_formed(figs, "predict")
    assert all(f["value"] is None and f["target"] is None for f in figs)
    # a median spread wider than the target's band is said to be so
    wide = predict.noise_figures({**noise, "spread_median": 1.3}, "", 0.1, "median")
    assert "narrower than the median point's repeat spread" in wide[0]["note"]


def test_matmul_noise_figure():
    rec = predict.matmul_noise((16, 16, 16), samples=3)
    assert len(rec["seconds"]) == 3 and rec["spread"] >= 1.0
    _well_formed(rec["figures"], "predict")
    assert rec["figures"][0]["target"] is None and rec["figures"][0]["unit"] == "x"


def test_predict_ratios_and_figures_from_the_predict_job_output(tmp_path):
    vm = _vm_frame()
    vm["residual"] = (vm["step_time_s"] - vm["measured_step_time_s"]) / vm["measured_step_time_s"]
    study_dir = tmp_path / "tiny"
    (study_dir / "predict").mkdir(parents=True)
    vm.to_csv(study_dir / "predict" / "predict_vs_measured.csv", index=False)
    _runs_frame().to_csv(study_dir / "runs.csv", index=False)
    rec = predict.measure(workdir=tmp_path / "work", study_dir=study_dir)
    assert rec["reused_run"] is True and rec["sweep_s"] is None
    assert not (tmp_path / "work").exists()  # nothing was run
    assert rec["n_points"] == 4 and rec["n_measured"] == 3
    ratio = {(p["series"], p["n"]): p["ratio"] for p in rec["points"]}
    assert ratio == pytest.approx({("weak", 1): 0.5, ("weak", 2): 0.8, ("strong", 1): 0.8})
    for (series, n), r in ratio.items():  # ratio = 1 + residual
        row = vm[(vm["series"] == series) & (vm["n"] == n)].iloc[0]
        assert r == pytest.approx(1 + row["residual"])
    assert rec["ratio_median"] == pytest.approx(0.8)
    assert rec["ratio_min"] == pytest.approx(0.5) and rec["ratio_max"] == pytest.approx(0.8)
    _well_formed(rec["figures"], "predict")
    names = [f["figure"] for f in rec["figures"]]
    assert sum(name.startswith("predicted/measured step time: ") for name in names) == 3
    # the one target is the median's; every point, the lowest and the highest are information
    targets = {f["figure"]: (f["op"], f["target"]) for f in rec["figures"] if f["target"]}
    assert sorted(targets.values()) == sorted([(">=", predict.MEDIAN_RANGE[0]),
                                               ("<=", predict.MEDIAN_RANGE[1])])
    assert predict.MEDIAN_RANGE == (0.9, 1.1) and not hasattr(predict, "RATIO_RANGE")
    by = {f["figure"]: f for f in rec["figures"]}
    assert by["predicted/measured step time, lowest point"]["value"] == pytest.approx(0.5)
    assert by["predicted/measured step time, highest point"]["met"] is None
    # the host's run-to-run noise from runs.csv, beside the ratios and in their units
    assert rec["noise"]["n_points"] == 3
    med = by["host noise: one point's repeats, slowest/fastest, median over points"]
    top = by["host noise: one point's repeats, slowest/fastest, largest"]
    assert med["value"] == pytest.approx(1.05) and med["unit"] == "x"
    assert top["value"] == pytest.approx(1.2) and top["target"] is None
    assert "repeats of one point differ by 5% median, 20% max" in med["note"]
    assert "no target is tighter than this noise" in med["note"]
    assert "| predict | predicted/measured step time: weak N=1 | 0.5 x |" in bench.table(
        rec["figures"])


def test_predict_reads_the_harness_sweep_of_the_same_call(tmp_path, monkeypatch):
    """``python -m benchmarks harness predict``: predict reads the sweep the harness just ran
    (the same study) instead of running it again. (Its own before-run sweep and one-process
    check are other figures, left out here: they train.)"""
    import yaml

    from conftest import TINY

    monkeypatch.setattr(predict, "measure_before_run",
                        lambda *a, **k: {"points": [], "figures": []})
    monkeypatch.setattr(predict, "validate", lambda *a, **k: {"rows": [], "figures": []})
    monkeypatch.setattr(predict, "matmul_noise", lambda *a, **k: {"spread": 1.1, "figures": []})

    study_file = tmp_path / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(TINY))
    harness_dir = tmp_path / "work" / "harness"
    (harness_dir / "results" / "tiny" / "predict").mkdir(parents=True)
    _vm_frame().to_csv(harness_dir / "results" / "tiny" / "predict" / "predict_vs_measured.csv",
                       index=False)
    args = bench.build_parser().parse_args(["harness", "predict", "--study", str(study_file)])
    rec = bench.run_one("predict", args, tmp_path / "work",
                        {"harness": {"study": str(study_file), "workdir": str(harness_dir)}})
    assert rec["reused_run"] and rec["study_dir"] == str(harness_dir / "results" / "tiny")
    assert rec["n_measured"] == 3 and not (tmp_path / "work" / "predict").exists()


def test_predicted_before_run_figures():
    vm = _vm_frame().assign(
        predicted_before_run_s=[None, 0.09, None, 0.33], calibration_factor=[None, 1.1, None, 1.1],
        calibrated_on=[None, "weak N=1", None, "strong N=1"],
        predicted_at=[None, "2026-12-01T10:00:00+00:00", None, "2026-12-01T10:00:00+00:00"],
        started_at=[None, "2026-12-01T10:01:00+00:00", None, None],
        predicted_before_start=[None, True, None, None])
    rec = predict.summarize_before_run(vm)
    assert [(p["series"], p["n"]) for p in rec["points"]] == [("weak", 2), ("strong", 2)]
    weak = rec["points"][0]
    assert weak["error"] == pytest.approx(-0.1)  # 0.09 predicted, 0.1 measured
    _well_formed(rec["figures"], "predict")
    by = {f["figure"]: f for f in rec["figures"]}
    err = by["predicted before run, |error|: weak N=2"]
    assert err["value"] == pytest.approx(0.1) and err["target"] == predict.BEFORE_RUN_ERROR
    assert err["met"] is True
    assert by["predicted before run, written before the point started: weak N=2"]["met"] is True
    # strong N=2 was not measured: no value, no verdict
    assert by["predicted before run, |error|: strong N=2"]["value"] is None
    assert by["predicted before run, written before the point started: strong N=2"]["met"] is None


def test_before_run_efficiency_is_printed_beside_the_noise():
    """The anchored efficiency predicted before the run, next to the measured one, the step's
    error and the repeat noise (``measure_before_run``'s printout; pure)."""
    vm = _vm_frame().assign(
        predicted_before_run_s=[None, 0.09, None, 0.33], software_rate=[0.5, 0.5, 0.7, 0.7],
        calibrated_on=["weak N=1"] * 2 + ["strong N=1"] * 2, anchored=[True, False, True, False],
        predicted_efficiency_before_run=[1.0, 0.9, 1.0, 0.8],
        predicted_efficiency_before_run_low=[1.0, 0.85, 1.0, 0.7],
        predicted_efficiency_before_run_high=[1.0, 0.95, 1.0, 0.9],
        measured_efficiency=[1.0, 0.95, 1.0, float("nan")],
        predicted_at=[None, "2026-12-01T10:00:00+00:00", None, "2026-12-01T10:00:00+00:00"],
        started_at=[None, None, None, None], predicted_before_start=[None, None, None, None])
    runs = _runs_frame()
    rec = predict.summarize_before_run(vm, "", runs)
    assert "software rate 0.50" in rec["figures"][0]["note"]
    eff = predict.before_run_efficiency(vm, rec["points"], rec["noise"])
    assert [(r["series"], r["n"]) for r in eff["rows"]] == [("weak", 2), ("strong", 2)]
    weak, strong = eff["rows"]
    assert weak["predicted_efficiency"] == 0.9 and weak["measured_efficiency"] == 0.95
    assert weak["step_error"] == pytest.approx(-0.1) and strong["measured_efficiency"] is None
    _well_formed(eff["figures"], "predict")
    assert all(f["target"] is None and f["met"] is None for f in eff["figures"])
    assert "band 85.0%-95.0%" in eff["figures"][0]["note"]
    assert "repeats differ by 5% median, 20% max" in eff["text"]
    assert "90.0% [85.0%, 95.0%]" in eff["text"] and "-10.0%" in eff["text"]


def test_predict_with_nothing_measured_reports_no_value():
    vm = _vm_frame().assign(measured_step_time_s=float("nan"))
    rec = predict.summarize(vm)
    assert rec["n_measured"] == 0 and rec["ratio_median"] is None
    _well_formed(rec["figures"], "predict")
    assert all(f["value"] is None and f["met"] is None for f in rec["figures"])


def test_trainer_loops_do_the_same_work_and_record_is_complete():
    point = trainer.default_point()
    assert isinstance(point, Point) and point.n == 1 and point.feasible
    rec = trainer.measure(point, rounds=2, block=2)
    eq = rec["equivalence"]
    # same init, batches, AdamW and clipping: fp32 on CPU agrees to rounding
    assert eq["steps"] == 2
    assert eq["loss_max_abs_diff"] < 1e-5 and eq["param_max_abs_diff"] < 2e-4, eq
    assert len(rec["rounds_detail"]) == 2
    assert {r["order"] for r in rec["rounds_detail"]} == {"trainer-bare", "bare-trainer"}
    assert rec["trainer_step_s"] > 0 and rec["bare_step_s"] > 0
    assert math.isclose(rec["overhead"] + 1, sorted(r["ratio"] for r in rec["rounds_detail"])[0]
                        / 2 + sorted(r["ratio"] for r in rec["rounds_detail"])[1] / 2)
    assert rec["trainer_step_cpu_s"] > 0 and rec["bare_step_cpu_s"] > 0
    assert len(rec["figures"]) == 2
    _well_formed(rec["figures"], "trainer")


LOG = """\
[Mon Nov 30 03:13:59 2026]
localrule plan:
    input: study.yaml
    jobid: 1
[Mon Nov 30 03:14:01 2026]
rule train:
    input: runs/a/point.json
    jobid: 6
[Mon Nov 30 03:14:02 2026]
Finished jobid: 1 (Rule: plan)
[Mon Nov 30 03:14:11 2026]
Finished jobid: 6 (Rule: train)
[Mon Nov 30 03:14:11 2026]
localrule aggregate:
    jobid: 2
[Mon Nov 30 03:14:14 2026]
Finished jobid: 2 (Rule: aggregate)
"""


def test_harness_log_parse_and_split():
    jobs = {j["rule"]: j for j in harness.parse_snakemake_log(LOG)}
    assert jobs["plan"]["duration_s"] == 3 and jobs["train"]["duration_s"] == 10
    assert jobs["aggregate"]["duration_s"] == 3
    runs = [{"point_id": "a", "n": 1, "state": "ok", "status_wall_s": 9.0, "train_wall_s": 4.0}]
    s = harness.split(20.0, runs, list(jobs.values()))
    p = s["parts_s"]
    assert p["training"] == 4.0 and p["torchrun_startup"] == 5.0 and p["runner"] == 1.0
    assert p["aggregation"] == 3.0 and p["plotting"] == 0.0 and p["calibration"] == 0.0
    assert math.isclose(sum(p.values()), 20.0) and s["overhead_s"] == 16.0
    assert s["run_jobs_s"]["plan"] == 3 and s["n_ok"] == 1


def test_scale_plans_and_aggregates_synthetic_records(tmp_path):
    study = scale.synthetic_study(80)
    assert len(study["series"]) == 2
    rec = scale.measure(80, tmp_path, dry_run=False)
    assert rec["n_planned"] == 80 and rec["n_feasible"] > 0
    runs = pd.read_csv(tmp_path / "results" / "scale" / "runs.csv")
    assert len(runs) == 80
    assert {"ok", "infeasible"} <= set(runs["status"])
    ok = runs[runs["status"] == "ok"]
    # synthetic records say 400 TFLOP/s of 989 at N=1: the aggregator must get that back
    n1 = ok[ok["n"] == 1]
    assert len(n1) and (abs(n1["mfu"] - 400 / 989) < 0.05).all()
    eff = pd.read_csv(tmp_path / "results" / "scale" / "efficiency.csv")
    assert len(eff) and eff["efficiency"].notna().any()
    _well_formed(rec["figures"], "scale")


def _check_gpu_records(rec: dict, names: list[str], fresh_process: bool = True) -> None:
    """``fresh_process=False``: the run shared this pytest process, whose lifetime peak RSS
    (ru_maxrss) may already exceed what training adds, so CPU peak memory can read 0."""
    assert [r["config"] for r in rec["records"]] == names
    cal = rec["calibration"]
    assert cal and cal["flops_per_s"] > 0 and cal["dtype"] == "bf16"
    for r in rec["records"]:
        assert set(r) == set(gpu.RECORD_FIELDS)
        assert r["state"] == "ok", r
        assert r["device_type"] == "cpu" and r["precision"] == "bf16"
        for k in ("tokens_per_s", "step_time_median_s", "model_tflops_per_s",
                  "util_vs_measured_ceiling", "n_params"):
            assert r[k] is not None and r[k] > 0, k
        assert r["peak_memory_gb"] is not None
        assert r["peak_memory_gb"] > 0 if fresh_process else r["peak_memory_gb"] >= 0
        # no spec peak for a CPU: no MFU, never a guess
        assert r["mfu"] is None and r["peak_tflops"] is None
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["step_time_median_s"])
    full = {r["activation_checkpointing"]: r for r in rec["records"]}
    if {"none", "full"} <= set(full):  # recompute counted in HFU-side FLOPs only
        assert (full["full"]["hardware_tflops_per_s"] / full["full"]["model_tflops_per_s"]
                > full["none"]["hardware_tflops_per_s"] / full["none"]["model_tflops_per_s"])
    _well_formed(rec["figures"], "gpu")


def test_gpu_smoke_in_process(tmp_path):
    rec = gpu.measure(tmp_path, smoke=True, launcher="inprocess")
    _check_gpu_records(rec, ["eager", "eager-ac"], fresh_process=False)
    saved = json.loads((tmp_path / "gpu_records.json").read_text())
    assert len(saved["records"]) == 2


def test_gpu_bench_script_smoke_end_to_end(tmp_path):
    """scripts/gpu_bench.sh --smoke: the pipeline path (runner -> torchrun -> train) and the
    files it leaves in $OUT."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "GPU_CONFIGS": "eager",
           "OMP_NUM_THREADS": "1"}
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_bench.sh"), "--smoke"], env=env,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rec = json.loads((tmp_path / "gpu.json").read_text())
    _check_gpu_records(rec, ["eager"])
    assert rec["load_1min_start"] is not None and rec["host"]["cores"] >= 1
    with open(tmp_path / "figures.csv") as f:
        rows = list(csv.DictReader(f))
    assert rows and set(bench.FIELDS) == set(rows[0]) and {r["benchmark"] for r in rows} == {"gpu"}
    assert "eager: tokens/s" in (tmp_path / "figures.md").read_text()
    run = tmp_path / "work" / "gpu" / "runs" / "gpu-eager"
    for name in ("point.json", "steps.jsonl", "summary.json", "env.json", "status.json"):
        assert (run / name).is_file(), name
    point = Point.from_json(json.loads((run / "point.json").read_text()))  # schema_version 2
    assert point.series == "eager" and point.n == 1 and point.train.precision == "bf16"
    assert json.loads((run / "summary.json").read_text())["point_id"] == point.point_id
