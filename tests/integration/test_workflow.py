"""End to end through Snakemake (subprocess): a tiny study produces every output, consistent;
running again does nothing; extending the grid runs only the new points. The study's first run
is the session's ``tiny_study_run`` (conftest.py), shared with test_predict_default.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from conftest import TINY, snakemake, trained
from scalestudy.config.point import SCHEMA_VERSION, Point

pytestmark = pytest.mark.workflow

FIGURES = ["efficiency_weak", "efficiency_strong", "throughput", "mfu", "breakdown"]


def test_every_output_exists_and_is_consistent(tiny_study_run):
    study_file, results, first = tiny_study_run
    out = results / "tiny"
    assert trained(first.stderr + first.stdout) == 4
    plan = pd.read_csv(out / "plan.tsv", sep="\t")
    assert len(plan) == 5 and plan["feasible"].sum() == 4
    bad = plan[~plan["feasible"]].iloc[0]
    assert bad["n"] == 3 and "not divisible" in bad["reason"]

    for pid in plan.loc[plan["feasible"], "point_id"]:
        run = out / "runs" / pid
        for name in ("point.json", "steps.jsonl", "summary.json", "status.json", "env.json",
                     "stdout.log"):
            assert (run / name).is_file(), run / name
        status = json.loads((run / "status.json").read_text())
        assert status["state"] == "ok", status
        steps = [json.loads(ln) for ln in (run / "steps.jsonl").read_text().splitlines()]
        assert len(steps) == 6 and sum(s["warmup"] for s in steps) == 2
        summary = json.loads((run / "summary.json").read_text())
        assert summary["loss_last"] < summary["loss_first"]
        doc = json.loads((run / "point.json").read_text())
        assert doc["schema_version"] == SCHEMA_VERSION
        point = Point.from_json(doc)
        assert point.point_id == pid and point.config_hash == summary["config_hash"]
        env = json.loads((run / "env.json").read_text())
        assert env["backend"] == "gloo" and env["world_size"] == point.n == doc["n"]

    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == len(plan)  # rows = points x repeats, infeasible ones included
    assert set(runs["status"]) == {"ok", "infeasible"}
    ok = runs[runs["status"] == "ok"]
    assert (ok["flops_convention"] == "megatron").all()
    assert ok["mfu"].isna().all()  # CPU: no spec peak, never a guess
    assert (ok["tokens_per_s_per_device"] > 0).all()

    eff = pd.read_csv(out / "efficiency.csv")
    base = eff[eff["n"] == eff["baseline_n"]]
    assert set(base["series"]) == {"weak", "strong"}
    assert (base["efficiency"] - 1).abs().max() < 1e-12
    weak2 = eff[(eff["series"] == "weak") & (eff["n"] == 2)].iloc[0]
    assert weak2["efficiency_ci_lo"] <= weak2["efficiency"] <= weak2["efficiency_ci_hi"]

    for fig in FIGURES:
        for ext in ("png", "pdf", "csv"):
            assert (out / "figures" / f"{fig}.{ext}").stat().st_size > 0
    residuals = pd.read_csv(out / "predict" / "predict_vs_measured.csv")
    assert residuals["residual"].notna().sum() == 4  # every measured point has a prediction
    assert (out / "predict" / "predict_vs_measured.png").stat().st_size > 0
    summary_md = (out / "summary.md").read_text()
    assert "| weak |" in summary_md and "efficiency" in summary_md
    # paper and report exports (tests/unit/test_exports.py, test_report_browser.py check them)
    assert "\\toprule" in (out / "summary.tex").read_text()
    assert 'id="scalestudy-front"' in (out / "report" / "front.html").read_text()


def test_every_profiled_point_is_explained_term_by_term(tiny_study_run):
    """Each run's traces are read into its terms; each point's measured terms add up to its
    step time, with at most 10% the trace cannot attribute beyond the time its ranks waited
    for a core (a busy host's scheduler stalls between operators: runqueue_wait_s); the
    efficiency lost term by term adds up to 1 − E; summary.md and the front page say where
    it went."""
    _, results, _ = tiny_study_run
    out = results / "tiny"
    runs = pd.read_csv(out / "runs.csv")
    for pid in runs.loc[runs["status"] == "ok", "point_id"]:
        rec = json.loads((out / "runs" / pid / "breakdown.json").read_text())
        assert rec["state"] == "ok", (pid, rec.get("reason"))
        n = int(runs.set_index("point_id").loc[pid, "n"])
        assert rec["ranks"] == list(range(n)) and rec["profiled_steps"] == 2
        assert (out / "runs" / pid / "traces" / "rank0.json.gz").stat().st_size > 0
        wait = rec["runqueue_wait_s"]  # (Linux: every rank says)
        summary = json.loads((out / "runs" / pid / "summary.json").read_text())
        ranks = [r for r in summary["profile"]["ranks"] if r["traced"]]
        # a step's wait is read inside its timed window (the trace's span is shorter: its
        # first operator to its last)
        assert wait is not None and 0 <= wait, rec
        assert all(r["runqueue_wait_s"] <= r["profiled_step_s"] for r in ranks), ranks
        assert rec["terms"]["unattributed_s"] - wait < 0.10 * rec["step_s"], (pid, rec["terms"],
                                                                          wait)
    brk = pd.read_csv(out / "breakdown.csv")
    step = brk[brk["in_step"] & brk["measured_s"].notna()]
    assert set(zip(step["series"], step["n"])) == {("weak", 1), ("weak", 2), ("strong", 1),
                                                   ("strong", 2)}
    for (series, n), g in step.groupby(["series", "n"]):
        # (the tables hold 6 significant digits of each term, and a negative residual may
        # balance terms larger than the step: the rounding is relative to their sizes)
        assert abs(g["measured_s"].sum() - g["step_time_s"].iloc[0]) < 1e-5 * g["measured_s"].abs().sum()
        # a column, not hidden: what the trace cannot say, and the timed step's difference
        # from the traced one (negative where the traced step was the longer), said in the
        # note where it is beyond the host's noise; no other term is scaled or negative
        r = g.iloc[0]
        assert (g["measured_s"].drop(g.index[g["term"] == "unattributed_s"]) > -1e-9).all()
        if abs(r["traced_step_s"] / r["step_time_s"] - 1) > 0.35:
            assert "the traced step" in r["note"], (series, n, r["note"])
        assert (g["profiler_dilation"] > 0).all()
    eff = pd.read_csv(out / "efficiency.csv").set_index(["series", "n"])
    loss = pd.read_csv(out / "efficiency_loss.csv")
    for (series, n), g in loss[loss["measured_loss"].notna()].groupby(["series", "n"]):
        assert abs(g["measured_loss"].sum() - (1 - eff.loc[(series, n), "efficiency"])) < 1e-4
    md = (out / "summary.md").read_text()
    assert "## Where the efficiency went" in md and "- weak at N=2 (vs N₀=1):" in md
    # the model's side, written by the prediction job (aggregate runs no model), every measured
    # point's terms; the front page (drawn after it) sets its losses beside the measured
    model = pd.read_csv(out / "predict" / "breakdown_predicted.csv")
    model = model[model["in_step"]]
    assert set(zip(step["series"], step["n"])) <= set(zip(model["series"], model["n"]))
    assert model["predicted_s"].notna().all() and (model["predicted_step_s"] > 0).all()
    front = (out / "report" / "front.html").read_text()
    assert "Where the efficiency went" in front and "the model:" in front


def test_rerun_is_a_noop(tiny_study_run):
    study_file, results, _ = tiny_study_run
    again = snakemake(study_file, results, "--dry-run")
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr


def test_report_html(tiny_report):
    # made once per session (conftest); tests/integration/test_report_browser.py opens it in Chromium
    assert tiny_report.stat().st_size > 10_000


def test_extending_the_grid_runs_only_new_points(tiny_study_run, tmp_path):
    # on a copy of the shared run (Snakemake's records included, times kept), which other
    # tests read alongside under pytest-xdist
    shared_study, shared_results, _ = tiny_study_run
    study_file, results = tmp_path / "tiny.yaml", tmp_path / "results"
    shutil.copy2(shared_study, study_file)
    shutil.copytree(shared_results, results, symlinks=True)
    # the folder names the shared study file; this edited copy elsewhere takes it over
    # (docs/failures.md, "Concurrent writers and shared results folders")
    (results / "tiny" / "study.json").unlink()
    runs_dir = results / "tiny" / "runs"
    before = {p.parent.name: p.stat().st_mtime_ns for p in runs_dir.glob("*/status.json")}
    extended = dict(TINY)
    extended["series"] = [dict(TINY["series"][0], gpus=[1, 2, 3]), TINY["series"][1]]
    study_file.write_text(yaml.safe_dump(extended))
    # up to the tables (the figures follow from them, checked on the shared run)
    r = snakemake(study_file, results, "--until", "aggregate")
    assert r.returncode == 0, r.stderr[-3000:]
    assert trained(r.stderr + r.stdout) == 1
    after = {p.parent.name: p.stat().st_mtime_ns for p in runs_dir.glob("*/status.json")}
    assert {k: after[k] for k in before} == before  # old points untouched
    new = set(after) - set(before)
    assert len(new) == 1 and "_n3_" in new.pop()
    eff = pd.read_csv(results / "tiny" / "efficiency.csv")
    assert 3 in set(eff.loc[eff["series"] == "weak", "n"])


def test_bad_study_fails_before_any_job(tmp_path):
    bad = dict(TINY, series=[dict(TINY["series"][0], mode="sideways")])
    study_file = tmp_path / "bad.yaml"
    study_file.write_text(yaml.safe_dump(bad))
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "run", str(study_file),
                        "--results", str(tmp_path / "results")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("scalestudy: error:")
    assert "series[0].mode: 'sideways' is not allowed" in r.stderr
    assert not (tmp_path / "results" / "tiny").exists()


def _dry_run(study_file, results) -> tuple[dict[str, int], list[str]]:
    """``({rule: jobs}, [job block])`` of the study's Snakemake dry run: its job stats, and
    each job's printed block (``rule NAME:`` and its fields)."""
    import re

    r = snakemake(study_file, results, "--dry-run")
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", r.stdout, re.M)}
    return jobs, re.split(r"^\[.*\]$", r.stdout, flags=re.M)


def test_a_host_model_study_calibrates_in_slices_among_its_runs(tmp_path):
    """The default study (host measurements on) times its blocks and core sharing in
    ``host_slices.SLICES`` jobs of their own (its collectives in
    ``collectives.COLLECTIVE_SLICES``), which need no input (so the scheduler places
    them among the runs) and hold the timed slot as a run does, and pools them into
    ``calibration.json``; the tiny study (host measurements off) runs no slice."""
    from scalestudy import paths
    from scalestudy.measure import collectives, host_slices

    default = paths.workflow_dir() / "config" / "default.yaml"
    jobs, blocks = _dry_run(default, tmp_path / "results")
    assert jobs["calibrate_slice"] == host_slices.SLICES
    assert jobs["calibrate"] == jobs["calibration"] == 1 and jobs["train"] == 30
    slices = [b for b in blocks if "rule calibrate_slice:" in b]
    assert len(slices) == host_slices.SLICES
    assert all("input:" not in b and "timed_slot=1" in b for b in slices)
    # and so are the collectives: slices among the runs, pooled into collectives.csv
    assert jobs["microbench_collectives_slice"] == collectives.COLLECTIVE_SLICES
    assert jobs["microbench_collectives"] == 1
    slices = [b for b in blocks if "rule microbench_collectives_slice:" in b]
    assert all("input:" not in b and "timed_slot=1" in b for b in slices)
    study_file = tmp_path / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(TINY))
    jobs, _ = _dry_run(study_file, tmp_path / "results")
    assert "calibrate_slice" not in jobs and jobs["calibration"] == 1
