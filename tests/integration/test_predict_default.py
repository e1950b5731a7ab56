"""The pipeline's ``predict`` job (performance model vs measurement) on the session's tiny
study run (``tiny_study_run``, conftest.py; the same Snakemake run test_workflow.py reads).

Only what is deterministic is checked here: the job's outputs exist, hold one row per
feasible configuration of the plan, and the measured step time and the residual
``(predicted - measured) / measured`` follow from ``runs.csv`` and ``study_predictions.csv``.
How close the prediction is to the measurement is a timing figure, never asserted in a test:
``python -m benchmarks predict`` runs the default study and reports the per-point
predicted/measured ratios and their median next to their targets (``make bench``).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.workflow


def test_predict_job_outputs_follow_from_the_plan_and_runs(tiny_study_run):
    _, results, _ = tiny_study_run
    out = results / "tiny"
    plan = pd.read_csv(out / "plan.tsv", sep="\t")
    configs = sorted(set(plan.loc[plan["feasible"], "config_hash"]))
    assert len(configs) == 4

    pred = pd.read_csv(out / "predict" / "study_predictions.csv")
    vm = pd.read_csv(out / "predict" / "predict_vs_measured.csv")
    assert (out / "predict" / "predict_vs_measured.png").stat().st_size > 0
    # one row per feasible config (repeats collapsed), in both tables
    assert sorted(pred["config_hash"]) == configs
    assert sorted(vm["config_hash"]) == configs
    assert np.isfinite(pred["step_time_s"]).all() and (pred["step_time_s"] > 0).all()

    # the prediction is carried over unchanged
    merged = vm.merge(pred[["config_hash", "step_time_s"]], on="config_hash",
                      suffixes=("", "_pred"))
    assert merged["step_time_s"].tolist() == pytest.approx(merged["step_time_s_pred"].tolist(),
                                                           rel=1e-12)

    # measured = median over the ok repeats of each run's median step time (runs.csv)
    runs = pd.read_csv(out / "runs.csv")
    ok = runs[runs["status"] == "ok"]
    measured = ok.groupby("config_hash")["step_time_median_s"].median()
    assert set(measured.index) == set(configs)  # every feasible config ran
    vm = vm.set_index("config_hash").loc[configs]
    assert vm["measured_step_time_s"].tolist() == pytest.approx(measured.loc[configs].tolist(),
                                                                rel=1e-12)

    # residual = (predicted - measured) / measured, for every config
    expected = (vm["step_time_s"] - vm["measured_step_time_s"]) / vm["measured_step_time_s"]
    assert vm["residual"].notna().all()
    assert vm["residual"].tolist() == pytest.approx(expected.tolist(), rel=1e-9, abs=1e-12)

    # the model ran on this host's own measurements (calibrate job), not the preset's figures
    cal = json.loads((out / "calibration.json").read_text())
    assert {r["layout"] for r in cal["overhead"]} == {"plain"}  # (no tensor-parallel point)
    assert cal["bandwidth"] and all(r["bytes_per_s"] > 0 for r in cal["bandwidth"])
    from scalestudy.perf.inputs import host_measurements

    host = host_measurements(out)
    assert host.mem_bw == max(r["bytes_per_s"] for r in cal["bandwidth"])
    assert host.overhead and host.matmul["fp32"][0][3] == cal["flops_per_s"]
