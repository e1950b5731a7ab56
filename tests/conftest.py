import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The benchmarks are a top-level package of the repository, not installed (python -m benchmarks
# runs from the root): importable by the tests however pytest is started.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

# The tiny study every end-to-end check shares: one Snakemake run per session
# (``tiny_study_run``), read by test_workflow.py and test_predict_default.py.
TINY = {
    "name": "tiny",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 6, "warmup_steps": 2},
    "platform": {"device": "cpu", "devices_per_node": 4},
    "series": [
        {"name": "weak", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2},
        # N=3 cannot split a global batch of 4 (infeasible, listed with its reason)
        {"name": "strong", "mode": "strong", "model": "m", "gpus": [1, 2, 3], "micro_batch": 1,
         "global_batch": 4},
    ],
}


@pytest.fixture
def repo() -> Path:
    return REPO


def snakemake(study_file, results, *extra, timeout=600, env=None) -> subprocess.CompletedProcess:
    """The study's Snakemake run as ``scalestudy run`` starts it (local profile)."""
    from scalestudy.cli import snakemake_argv
    from scalestudy.paths import profile

    argv = snakemake_argv(str(study_file), str(results), str(profile("local")), list(extra))
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def run_row(plan_row: dict, run_dir, calibration: dict | None, convention: str | None):
    """One run's ``runs.csv`` row, its steady-state step times (s) and the bootstrap
    distribution of their median, by the functions ``aggregate.collect`` runs on every run
    (``read_run``, then ``step_columns``)."""
    from scalestudy.analysis import aggregate

    row, times, constants = aggregate.read_run(plan_row, run_dir, calibration, convention)
    cols, dists = aggregate.step_columns([times], [aggregate._seed(str(plan_row["point_id"]))],
                                         [constants])
    row.update({c: v[0].item() for c, v in cols.items()})
    return row, times, dists[0]


def trained(out: str) -> int:
    """How many training jobs a Snakemake run executed."""
    return out.count("rule train:")


@pytest.fixture(scope="session")
def tiny_study_run(tmp_path_factory):
    """``(study_file, results, first_run)``: the TINY study run once through Snakemake (once
    per pytest-xdist worker). Its readers never change it: a test that extends a study runs
    its own."""
    import yaml

    root = tmp_path_factory.mktemp("wf")
    study_file = root / "tiny.yaml"
    study_file.write_text(yaml.safe_dump(TINY))
    results = root / "results"
    first = snakemake(study_file, results)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return study_file, results, first


@pytest.fixture(scope="session")
def tiny_report(tiny_study_run):
    """``report.html`` of the shared tiny study run (``snakemake --report``), made once."""
    study_file, results, _ = tiny_study_run
    report = results / "tiny" / "report.html"
    if not report.exists():
        r = snakemake(study_file, results, "--report", str(report))
        assert r.returncode == 0, r.stderr[-2000:]
    return report
