import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The benchmarks are a top-level package of the repository, not installed (python -m benchmarks
# runs from the root): importable by the tests however pytest is started.
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

# The tiny study every end-to-end check shares: one Snakemake run per session
# (``tiny_study_run``), read by test_workflow.py, test_predict_default.py and test_export.py.
TINY = {
    "name": "tiny",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 6, "warmup_steps": 2},
    "platform": {"device": "cpu", "devices_per_node": 4},
    # traces of 2 steps after each timed window: the breakdown's tables, figure and sentences
    "profile": {"enabled": True, "steps": 2, "warmup": 1},
    "series": [
        {"name": "weak", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2},
        # N=3 cannot split a global batch of 4 (infeasible, listed with its reason)
        {"name": "strong", "mode": "strong", "model": "m", "gpus": [1, 2, 3], "micro_batch": 1,
         "global_batch": 4},
    ],
}


# The files that take longest (seconds on the 2-core CI box), first, and the first reader of the
# shared tiny study among them (so that it is made while the others run): under ``--dist
# loadfile --no-loadscope-reorder`` a worker takes the next file in this order when it is done
# with one, so the long ones starting first keep the end of the run short (longest
# processing time first). The Slurm file is the longest and mostly waits (Slurm's scheduling,
# Snakemake's status polls): started first, its worker's waiting overlaps the others' work.
LONGEST_FIRST = ("test_slurm.py", "test_parallel_parity.py", "test_foreign.py", "test_workflow.py",
                 "test_gpu_check.py", "test_faults.py", "test_install.py", "test_lifetime.py",
                 "test_examples.py", "test_export.py", "test_tune_measure.py", "test_compare.py",
                 "test_sitepolicy.py", "test_rendezvous.py", "test_trust.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable within a file


def as_from_a_terminal() -> None:
    """For ``Popen(preexec_fn=...)``: SIGINT delivered and handled as in a terminal's
    foreground job (a test runner's worker may hand its children SIGINT ignored or blocked,
    which Python and Snakemake then keep ignoring, so a test's Ctrl-C would not arrive)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextmanager
def small_tmpfs(path: Path, size: str):
    """A real, small file system at ``path`` (a tmpfs of ``size``, e.g. ``4m``), unmounted
    after the block; the test is skipped where it cannot be mounted (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}); the "
                    "injected ENOSPC tests still run")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def repo() -> Path:
    return REPO


def snakemake(study_file, results, *extra, timeout=600, env=None) -> subprocess.CompletedProcess:
    """The study's Snakemake run as ``scalestudy run`` starts it (local profile)."""
    from scalestudy.run.snakemake import snakemake_argv
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


@contextmanager
def made_once(tmp_path_factory, name: str):
    """``(folder, first)``: a folder shared by the whole pytest run, every pytest-xdist worker
    included (the run's base temp folder; a plain run's own), made by the first worker that
    asks, under a lock, while the others wait. ``first`` is true for the one that makes it: it
    writes the folder inside the block and the block's success marks it made."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's, above the workers' popen-gwN
    folder = base / name
    with open(base / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = folder / ".made"
        first = not made.exists()
        if first:
            shutil.rmtree(folder, ignore_errors=True)  # a failed maker's leftovers
            folder.mkdir()
        yield folder, first
        made.touch()


@pytest.fixture(scope="session")
def tiny_study_run(tmp_path_factory):
    """``(study_file, results, first_run)``: the TINY study run once through Snakemake for the
    whole pytest run (every xdist worker reads the same run), with its ``report.html`` made
    in the same go (a later Snakemake on the folder would meet the study's lock). Its readers
    never change it: a test that extends a study runs on a copy."""
    import yaml

    with made_once(tmp_path_factory, "tiny-study") as (root, first):
        study_file, results = root / "tiny.yaml", root / "results"
        if first:
            study_file.write_text(yaml.safe_dump(TINY))
            run = snakemake(study_file, results)
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
            (root / "first.json").write_text(json.dumps(
                {"args": run.args, "returncode": run.returncode, "stdout": run.stdout,
                 "stderr": run.stderr}))
            report = results / "tiny" / "report.html"
            from scalestudy.run.snakemake import report_env

            r = snakemake(study_file, results, "--report", str(report), env=report_env())
            assert r.returncode == 0, r.stderr[-2000:]
            # the report step as `scalestudy run` runs it ends without Snakemake's stray warning
            assert "was never awaited" not in r.stderr, r.stderr[-2000:]
    first_run = subprocess.CompletedProcess(**json.loads((root / "first.json").read_text()))
    return study_file, results, first_run


@pytest.fixture(scope="session")
def tiny_report(tiny_study_run):
    """``report.html`` of the shared tiny study run (``snakemake --report``)."""
    _, results, _ = tiny_study_run
    return results / "tiny" / "report.html"
