"""Outputs under stress: a results folder that cannot be written and a full disk end every
writing command (and workflow rule) with one line naming the path, exit status 2, nothing
half-written, and the next run finishes the job; concurrent writers of a study's tables never
collide; two study files with the same name never share a results folder silently."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import small_tmpfs, snakemake
from scalestudy import cli
from scalestudy.plan.planner import write_plan
from scalestudy.record import io
from scalestudy.record.bounded_read import RecordError
from scalestudy.record.source import SOURCE_KEY
from scalestudy.report.plots import FIGURES
from scalestudy.run import guard
from scalestudy.run.workflow import workflow_setup
from scalestudy.report import aggregate as report_aggregate
from scalestudy.report.aggregate import aggregate_study

sys.path.insert(0, str(Path(__file__).parents[1]))
from synthetic_study import make_study  # noqa: E402

TABLES = ("runs.csv", "runs.parquet", "efficiency.csv", "breakdown.csv", "efficiency_loss.csv",
          "summary.md", "summary.tex")
FIX = "; free space there and run again"


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory) -> Path:
    """A synthetic study folder with its tables written (copy it before changing it)."""
    d = make_study(tmp_path_factory.mktemp("stress"))
    aggregate_study(d)
    return d


def _copy(study: Path, root: Path) -> Path:
    return Path(shutil.copytree(study, root / study.name))


def _tables(d: Path) -> dict:
    return {n: (d / n).read_bytes() for n in TABLES}


def _temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(".")
            and p.name not in (guard.LOCK_FILE, io.TABLES_LOCK)]


def _full(*a, **k):  # what a write() on a full disk raises: no file named
    raise OSError(errno.ENOSPC, "No space left on device")


# --- atomic writes name their target ----------------------------------------------------------

def test_a_failed_atomic_write_names_its_target_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError) as e:
        with io.atomic_path(tmp_path / "a.csv") as tmp:
            tmp.write_text("half")
            _full()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "a.csv")
    with pytest.raises(OSError) as e:
        with io.atomic_paths([tmp_path / "b.csv", tmp_path / "c.md"]):
            _full()
    assert e.value.filename == str(tmp_path)  # several files: their folder
    assert io.os_error_line(e.value) == f"{tmp_path}: no space left on device{FIX}"
    assert list(tmp_path.iterdir()) == []


# --- full disk and unwritable folders: one line, exit 2, the next run finishes ----------------

def test_aggregate_on_a_full_disk_is_one_line_and_the_next_run_finishes(aggregated, tmp_path,
                                                                        monkeypatch, capsys):
    d = _copy(aggregated, tmp_path)
    before = _tables(d)
    (d / "runs" / "weak-dp_n2_dp2-tp1-pp1_gb8_abcd0002_r1" / "steps.jsonl").unlink()
    monkeypatch.setattr(report_aggregate, "summary_latex", _full)
    for main in (lambda: cli.main(["aggregate", str(d)]),):
        assert main() == 2  # scalestudy aggregate, what the workflow rule runs too
        err = capsys.readouterr().err
        assert err == f"scalestudy: error: {d}: no space left on device{FIX}\n"
        assert _tables(d) == before and _temps(d) == []  # the old tables, whole
    monkeypatch.undo()
    assert cli.main(["aggregate", str(d)]) == 0
    assert _tables(d) != before and _temps(d) == []


def test_plot_into_an_unwritable_figures_folder_is_one_line(aggregated, tmp_path, capsys):
    d = _copy(aggregated, tmp_path)
    (d / "figures").write_text("not a folder")  # root ignores chmod: a file in the way
    assert cli.main(["plot", str(d)]) == 2
    out = capsys.readouterr()
    assert out.err == (f"scalestudy: error: {d / 'figures'}: exists and is not a folder; "
                       "move it away and run again\n")
    assert out.out == ""
    (d / "figures").unlink()
    assert cli.main(["plot", str(d)]) == 0
    assert len(list((d / "figures").glob("*.png"))) == len(FIGURES)


def test_plan_and_compare_into_an_unwritable_folder_are_one_line(aggregated, tmp_path, capsys):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a folder should be")
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({
        "name": "s", "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16,
                                      "vocab": 64}},
        "train": {"steps": 4, "warmup_steps": 1}, "platform": {"device": "cpu"},
        "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 2}]}))
    assert cli.main(["plan", str(study), "--write", "--results", str(blocked)]) == 2
    err = capsys.readouterr().err
    assert err == (f"scalestudy: error: {blocked / 's'}: a part of this path is a file, not a "
                   "folder; move that file away and run again\n")
    other = _copy(aggregated, tmp_path / "b")
    assert cli.main(["compare", str(aggregated), str(other), "--out", str(blocked / "c")]) == 2
    assert capsys.readouterr().err == (f"scalestudy: error: {blocked / 'c'}: a part of this "
                                       "path is a file, not a folder; move that file away and "
                                       "run again\n")


def test_status_into_a_full_standard_output_is_one_line(aggregated):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "status", str(aggregated)],
                           stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"scalestudy: error: standard output: no space left on device{FIX}\n"


def test_a_real_full_disk_fails_aggregate_and_plot_with_one_line_then_they_finish(
        aggregated, tmp_path, capsys):
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        d = _copy(aggregated, mnt)
        before = _tables(d)
        filler = mnt / "filler"
        with open(filler, "wb") as f:  # fill the disk to the last block
            try:
                while True:
                    f.write(b"x" * 65536)
                    f.flush()
            except OSError as e:
                assert e.errno == errno.ENOSPC
        for argv in (["aggregate", str(d)], ["plot", str(d)]):
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"scalestudy: error: {d}")
            assert err.endswith(f": no space left on device{FIX}\n"), err
        assert _tables(d) == before and _temps(d) == []
        assert not [p for p in (d / "figures").iterdir() if p.name.startswith(".")]
        filler.unlink()
        assert cli.main(["aggregate", str(d)]) == 0 and cli.main(["plot", str(d)]) == 0
        assert _temps(d) == [] and len(list((d / "figures").glob("*.pdf"))) == len(FIGURES)


@pytest.mark.workflow
def test_a_workflow_rule_that_cannot_write_fails_with_one_line_and_the_others_go_on(
        tiny_study_run, tmp_path):
    study_file, results, _ = tiny_study_run
    copy = Path(shutil.copytree(results, tmp_path / "results", symlinks=True))
    out = (copy / "tiny").resolve()
    (out / "figures" / "mfu.csv").unlink()  # plots runs again, onto a full disk
    predicted = out / "predict" / "predict_vs_measured.png"
    predicted.unlink()  # predict runs again (plots, which draws its side, waits for it)
    full = {**os.environ, "SCALESTUDY_TEST_FULL_DISK": str(out / "figures"),
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "full_disk"),
                                           os.environ.get("PYTHONPATH", "")])}
    r = snakemake(study_file, copy, env=full)
    assert r.returncode != 0
    log = (out / "logs" / "plots.log").read_text()
    assert log == (f"scalestudy: error: {out / 'figures' / 'efficiency_weak.png'}: no space "
                   f"left on device{FIX}\n"), log
    # no temp file left (Snakemake removes a failed job's outputs, and their emptied folder)
    assert not [p.name for p in out.glob("figures/.*")]
    assert predicted.is_file(), r.stderr[-3000:]  # the sweep's other jobs went on
    r = snakemake(study_file, copy)  # space again: the next run finishes the job
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "figures" / "mfu.csv").is_file() and (out / "report" / "front.html").is_file()


# --- concurrent writers -----------------------------------------------------------------------

def test_clean_temps_removes_a_dead_writers_temp_never_a_live_ones(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = tmp_path / f".runs.{os.getpid()}.abc123.csv"
    stale = tmp_path / f".runs.{dead.pid}.def456.csv"
    old = tmp_path / ".efficiency.x1y2z3.csv"  # a name from before the pid was in it
    for p in (live, stale, old):
        p.write_text("x")
    assert sorted(io.clean_temps(tmp_path, ("runs", "efficiency"))) == sorted([stale, old])
    assert live.exists()


def test_a_writer_held_past_the_wait_is_one_line_naming_the_lock(aggregated, capsys):
    lock = aggregated / io.TABLES_LOCK
    with io.tables_lock(aggregated):
        with pytest.raises(io.TablesBusy) as e:
            with io.tables_lock(aggregated, wait_s=0):
                pass
    assert str(e.value) == (f"{lock}: another aggregate or plot of this study (pid {os.getpid()})"
                            " still writes its tables after 0 s; wait for it to end (or end it) "
                            "and run again")
    assert io.os_error_line(e.value) == str(e.value)
    assert capsys.readouterr().err.startswith("scalestudy: waiting for another aggregate")


# B stops inside its atomic write (its temp files exist) until the test says go.
PAUSED_AGGREGATE = """
import sys
from scalestudy import cli
from scalestudy.report import aggregate
real = aggregate.summary_latex
def paused(*a, **k):
    print("writing", flush=True)
    sys.stdin.readline()
    return real(*a, **k)
aggregate.summary_latex = paused
sys.exit(cli.main(["aggregate", sys.argv[1]]))
"""


def test_two_aggregates_at_once_both_succeed_and_the_tables_are_whole(aggregated, tmp_path):
    d = _copy(aggregated, tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    b = subprocess.Popen([sys.executable, "-c", PAUSED_AGGREGATE, str(d)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert b.stdout.readline() == "writing\n", b.stderr.read()
        a = subprocess.Popen([sys.executable, "-m", "scalestudy.cli", "aggregate", str(d)],
                             stderr=subprocess.PIPE, text=True, env=env)
        # a waits for b's lock (it says so), or, without the lock, it ran through b's temp files
        first = a.stderr.readline()
        b.stdin.write("go\n")
        b.stdin.close()
        assert b.wait(timeout=300) == 0, b.stderr.read()
        assert a.wait(timeout=300) == 0, first + a.stderr.read()
        assert first.startswith(f"scalestudy: waiting for another aggregate or plot of {d}")
    finally:
        for p in (b, locals().get("a")):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    runs = pd.read_csv(d / "runs.csv")
    assert len(runs) == len(pd.read_csv(aggregated / "runs.csv"))
    assert pd.read_parquet(d / "runs.parquet").shape == runs.shape
    assert _temps(d) == []


# --- one study file per results folder --------------------------------------------------------

def _study_file(path: Path, steps: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "name": "mini", "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16,
                                         "vocab": 64}},
        "train": {"steps": steps, "warmup_steps": 1}, "platform": {"device": "cpu"},
        "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                    "micro_batch": 2}]}))
    return path


def _launch(study_file: Path, results: Path):
    """What a launcher does: claim the study, then its plan rule writes plan.tsv and
    study.json; the lock is released at the end."""
    setup = workflow_setup({"study": str(study_file), "results": str(results)}, claim=True,
                           environ={})
    try:
        write_plan(list(setup.points.values()), setup.out, setup.study, setup.source)
    finally:
        os.close(setup.lock)
    return setup


def test_two_study_files_with_one_name_do_not_share_a_results_folder(tmp_path, capsys):
    results = tmp_path / "results"
    x = _study_file(tmp_path / "a" / "x.yaml")
    y = _study_file(tmp_path / "b" / "y.yaml", steps=8)  # the same name, another study
    _launch(x, results)
    folder = results / "mini"
    recorded = json.loads((folder / "study.json").read_text())
    assert recorded[SOURCE_KEY] == str(x.resolve())
    before = sorted(p.name for p in folder.iterdir())
    with pytest.raises(RecordError) as e:
        _launch(y, results)
    assert str(e.value) == (f"{folder} was made by {x.resolve()}; this study file {y.resolve()} "
                            "has the same name: rename one (its name:) or use --results OTHER "
                            f"(if it is that study moved, remove {folder / 'study.json'} and "
                            "run again)")
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing taken or written
    assert json.loads((folder / "study.json").read_text()) == recorded
    # scalestudy status of the other file: the same line, not the first study's points
    assert cli.main(["status", str(y), "--results", str(results)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"scalestudy: error: {e.value}\n"
    assert cli.main(["status", str(x), "--results", str(results)]) == 0
    capsys.readouterr()
    # scalestudy run of the other file: the same line, before Snakemake starts
    assert cli.main(["run", str(y), "--results", str(results)]) == 2
    assert capsys.readouterr().err == f"scalestudy: error: {e.value}\n"
    # the same study moved (an equal study at another path) is still the same study
    moved = tmp_path / "c" / "x.yaml"
    moved.parent.mkdir()
    shutil.move(x, moved)
    _launch(moved, results)
    assert json.loads((folder / "study.json").read_text())[SOURCE_KEY] == str(moved.resolve())
    # the explicit override: without study.json the folder goes to the next launcher
    (folder / "study.json").unlink()
    _launch(y, results)
    assert json.loads((folder / "study.json").read_text())[SOURCE_KEY] == str(y.resolve())


def test_a_read_only_results_folder_is_one_line_before_any_job(tmp_path, capsys):
    """``scalestudy run`` and Snakemake run directly (the rules' setup) into a read-only file
    system: the one ``scalestudy: error:`` line naming the path, no stack trace."""
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({r.stderr.strip() or r.returncode})")
    try:
        study = tmp_path / "ro-study.yaml"
        study.write_text(yaml.safe_dump({
            "name": "rostudy", "models": {"m": {"layers": 1, "hidden": 16, "heads": 2,
                                                "seq_len": 8, "vocab": 32}},
            "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1],
                        "micro_batch": 1}]}))
        want = (f"scalestudy: error: {ro / 'rostudy'}: read-only file system; write the "
                "results elsewhere and run again")
        assert cli.main(["run", str(study), "--results", str(ro)]) == 2
        assert capsys.readouterr().err.strip() == want
        direct = snakemake(study, ro, "-n")
        assert direct.returncode != 0 and want in direct.stderr
        assert "Traceback" not in direct.stderr and "common.smk" not in direct.stderr
    finally:
        subprocess.run(["umount", str(ro)], check=False)
