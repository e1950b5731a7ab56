"""``scalestudy tune STUDY --measure`` end to end on this host: real runs through Snakemake and
the runner, a layout whose runs crash (tests/fault_injection.py) told to the search as zero
throughput, the outputs, and a rerun that measures nothing again (the trials' records and
point ids are reused; a search whose own record is gone is answered from the runs' records)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scalestudy.config.study import load_study
from scalestudy.record.trials import read_trials

REPO = Path(__file__).resolve().parents[2]

STUDY = {
    "name": "tune-it",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 4, "warmup_steps": 1},
    "platform": {"device": "cpu", "devices_per_node": 2, "timeout_s": 300},
    "tune": {"model": "m", "gpus": 2, "global_batch": 4,
             "space": {"tp": [1, 2], "pp": [1], "micro_batch": [1, 2], "dp_mode": ["ddp"],
                       "activation_checkpointing": ["none"]},
             "trials": 3, "warm_start": 1},
}


def _tune(study: Path, results: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    if fault:  # every rank 1 of a tp=2 layout dies at its first step
        env.update(SCALESTUDY_STEP_HOOK="fault_injection:make_hook", SCALESTUDY_FAULT=fault)
    return subprocess.run([sys.executable, "-m", "scalestudy.cli", "tune", str(study),
                           "--measure", "--results", str(results)],
                          capture_output=True, text=True, env=env, timeout=600)


def _status_files(results: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in results.rglob("runs/*/status.json")}


@pytest.mark.timeout(900)
def test_tune_measures_learns_from_failures_and_reuses_its_records(tmp_path):
    study = tmp_path / "tune.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    results = tmp_path / "results"
    done = _tune(study, results, fault="kill:rank=1:step=0:match=tp2-")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = results / "tune-it" / "tune"
    trials = read_trials(out / "trials.csv")
    measured = trials[~trials["state"].isin(["refused", "duplicate"])]
    assert measured["layout"].nunique() == 3  # the budget
    # 2 of the 4 layouts are tp=2: at least one was measured, crashed, and was told zero
    crashed = trials[trials["state"] == "crashed"]
    assert len(crashed) >= 1 and (crashed["tp"] == 2).all()
    assert (crashed["measured_tokens_per_s_per_device"] == 0).all()
    complete = trials[trials["state"] == "complete"]
    assert len(complete) >= 1 and (complete["tp"] == 1).all()
    assert (complete["measured_tokens_per_s_per_device"] > 0).all()
    assert bool(trials.iloc[0]["warm_start"])  # the model's pick first
    # every trial a point of the pipeline: its record under the rung study's runs/
    for pid in measured["point_id"]:
        assert (out / "runs" / "tune-it-s4" / "runs" / pid / "status.json").is_file()
    # the best layout as a study to run, and the report
    best = load_study(out / "best.yaml")
    top = complete.loc[complete["measured_tokens_per_s_per_device"].idxmax()]
    (series,) = best.series
    assert series.name == f"best-{top['layout']}" and best.tune is None
    assert (series.tp, series.micro_batch) == (top["tp"], top["micro_batch"])
    for name in ("convergence.png", "convergence.pdf", "summary.md"):
        assert (out / name).stat().st_size > 0
    assert top["layout"] in (out / "summary.md").read_text()

    # run again: the budget is spent, nothing runs
    before = _status_files(results)
    again = _tune(study, results)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _status_files(results) == before
    assert len(read_trials(out / "trials.csv")) == len(trials)

    # the search's own record lost: the same search, answered from the runs' records
    (out / "trials.csv").unlink()
    (out / "optuna.journal").unlink()
    third = _tune(study, results)
    assert third.returncode == 0, third.stderr[-3000:]
    assert _status_files(results) == before  # no run again
    redo = read_trials(out / "trials.csv")
    ran = redo[~redo["state"].isin(["refused", "duplicate"])]
    assert ran["reused"].all() and (ran["device_hours"] == 0).all()
    assert sorted(ran["layout"].unique()) == sorted(measured["layout"].unique())
    assert pd.Series(ran["state"]).isin(["complete", "crashed"]).all()

