"""The benchmarks produce complete, well-formed records (no timing is asserted here: the
figures themselves are read in ``make bench``)."""

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

from scalestudy import bench
from scalestudy.benchmarks import figure, gpu, harness, scale, trainer

REPO = Path(__file__).resolve().parents[1]
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


def test_trainer_loops_do_the_same_work_and_record_is_complete():
    rec = trainer.measure(trainer.default_point(), rounds=2, block=2)
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
