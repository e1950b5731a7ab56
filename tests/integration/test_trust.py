"""Records you can trust: writes stay inside the results folder and honour the umask, a full
disk is a crashed point (and aggregate writes all its tables or none), one lock for every
launcher, damaged status.json files rerun, and the point hash holds every setting that changes
the measurement."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import as_from_a_terminal, small_tmpfs
from scalestudy import cli
from scalestudy.report.aggregate import aggregate_study
from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Platform
from scalestudy.config.identity import config_hash
from scalestudy.record import io
from scalestudy.record.bounded_read import RecordError
from scalestudy.run import guard, runner

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parents[1]))
from synthetic_study import make_study  # noqa: E402
from test_faults import fake_launch  # noqa: E402,F401 - the fixture: torchrun replaced by python -c


# --- the umask -------------------------------------------------------------------------------

def test_files_are_created_with_the_users_umask(tmp_path):
    old = os.umask(0o002)
    try:
        p = io.write_text(tmp_path / "a.txt", "x")
        with io.atomic_paths([tmp_path / "b.csv", tmp_path / "c.md"]) as (b, c):
            b.write_text("1")
            c.write_text("2")
    finally:
        os.umask(old)
    for f in (p, tmp_path / "b.csv", tmp_path / "c.md"):
        assert f.stat().st_mode & 0o777 == 0o664, oct(f.stat().st_mode)


# --- all tables or none, stale temps ---------------------------------------------------------

def test_aggregate_writes_all_tables_or_none_and_cleans_stale_temps(tmp_path, monkeypatch):
    from scalestudy.report import aggregate

    d = make_study(tmp_path)
    aggregate_study(d)
    before = {n: (d / n).read_bytes() for n in ("runs.csv", "efficiency.csv", "summary.md")}
    (d / ".efficiency.x1y2z3.csv").write_text("left by a killed aggregate")
    # a run changes, then the disk fills while the last table is written
    pid = "weak-dp_n2_dp2-tp1-pp1_gb8_abcd0002_r1"
    (d / "runs" / pid / "steps.jsonl").unlink()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(d / "summary.tex"))
    monkeypatch.setattr(aggregate, "summary_latex", full)
    with pytest.raises(OSError):
        aggregate_study(d)
    assert {n: (d / n).read_bytes() for n in before} == before  # none of the new tables
    assert not [p for p in d.iterdir() if p.name.startswith(".")
                and p.name not in (".lock", io.TABLES_LOCK)]
    monkeypatch.undo()
    aggregate_study(d)
    runs = pd.read_csv(d / "runs.csv").set_index("point_id")
    assert runs.loc[pid, "status"] == "invalid"


# --- nothing written outside the results folder ----------------------------------------------

def _fake_point(run_dir: Path) -> Path:
    point = Point.for_layout(Model(), device="cpu", timeout_s=60, collective_timeout_s=5,
                             point_id="fake_n1")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "point.json").write_text(point.json_text())
    return run_dir


def test_a_symlinked_run_folder_is_refused_and_left_untouched(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    _fake_point(elsewhere)
    (elsewhere / "summary.json").write_text("{}")
    study = tmp_path / "results" / "s"
    (study / "runs").mkdir(parents=True)
    link = study / "runs" / "fake_n1"
    link.symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())
    assert cli.main(["run-point", str(link / "point.json"), str(link)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symlink leading outside" in err
    assert sorted(p.name for p in elsewhere.iterdir()) == before
    with pytest.raises(RecordError, match="is a symlink to .*outside"):
        guard.claim_study(study, ["fake_n1"])
    assert not (study / guard.LOCK_FILE).exists()  # refused before anything was written


def test_a_symlinked_figures_folder_is_refused_by_plot_and_run(tmp_path, capsys):

    d = make_study(tmp_path)
    aggregate_study(d)
    outside = tmp_path / "paper"
    outside.mkdir()
    (d / "figures").symlink_to(outside)
    assert cli.main(["plot", str(d)]) == 2
    assert "figures is a symlink to" in capsys.readouterr().err
    assert not list(outside.iterdir())

    # scalestudy run: the same line, exit 2, before Snakemake starts
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({
        "name": "synth", "models": {"m": {"layers": 2, "hidden": 32, "heads": 2,
                                          "seq_len": 16, "vocab": 64}},
        "train": {"steps": 4, "warmup_steps": 1}, "platform": {"device": "cpu"},
        "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 2}]}))
    assert cli.main(["run", str(study), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "figures is a symlink to" in err


# --- a full disk ------------------------------------------------------------------------------

FILL = ("import sys\n"
        "try:\n"
        "    while True:\n"
        "        sys.stdout.write('x' * 65536)\n"
        "        sys.stdout.flush()\n"
        "except OSError as e:\n"
        "    sys.exit(1)\n")


def test_a_full_disk_is_a_crashed_point_with_its_reason(tmp_path, fake_launch):
    # a real full file system: a 1 MiB tmpfs (root may mount; else this is skipped)
    with small_tmpfs(tmp_path / "small", "1m") as mnt:
        run_dir = _fake_point(mnt / "run")
        fake_launch(FILL)  # the command fills the disk through its log
        status = runner.run_point(run_dir / "point.json", run_dir)
        assert status["state"] == "crashed"
        assert status["reason"] == f"no space left on device ({run_dir})"
        saved = json.loads((run_dir / "status.json").read_text())  # room was made for it
        assert saved["reason"] == status["reason"]


def test_an_injected_enospc_while_writing_is_a_crashed_point(tmp_path, fake_launch, monkeypatch):
    run_dir = _fake_point(tmp_path / "run")
    fake_launch("print('training')\n")
    real = runner.outcome.classify

    def classify(*a, **k):  # the trainer's summary.json write found the disk full
        raise OSError(errno.ENOSPC, "No space left on device", str(run_dir / "summary.json"))
    monkeypatch.setattr(runner.outcome, "classify", classify)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "crashed"
    assert status["reason"] == f"no space left on device ({run_dir / 'summary.json'})"
    monkeypatch.setattr(runner.outcome, "classify", real)


# --- damaged status.json: rerun ---------------------------------------------------------------

def test_a_damaged_status_json_is_removed_so_the_point_reruns(tmp_path):
    study = tmp_path / "s"
    for pid, text in (("a", ""), ("b", "{\"state\": \"ok\", "), ("c", json.dumps({"state": "ok"})),
                      ("d", json.dumps({"state": 3}))):
        (study / "runs" / pid).mkdir(parents=True)
        (study / "runs" / pid / "status.json").write_text(text)
    lines = guard.rerun_damaged(study, ["a", "b", "c", "d", "e"])
    assert [ln.split(":")[0] for ln in lines] == ["a", "b", "d"]
    assert [p.parent.name for p in sorted(study.glob("runs/*/status.json"))] == ["c"]


# --- one lock for every launcher --------------------------------------------------------------

def test_lock_is_exclusive_and_released_with_its_process(tmp_path):
    fd = guard.lock_study(tmp_path)
    assert guard.is_locked(tmp_path)
    with pytest.raises(guard.StudyLocked, match=f"pid {os.getpid()} on .* since"):
        guard.lock_study(tmp_path)
    os.close(fd)
    assert not guard.is_locked(tmp_path)
    os.close(guard.lock_study(tmp_path))


LOCK_STUDY = {
    "name": "locked",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 4, "warmup_steps": 1},
    "platform": {"device": "cpu"},
    "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 2}],
}


@pytest.mark.workflow
def test_two_launchers_of_one_study_at_once_the_second_refuses(tmp_path):
    study_file = tmp_path / "locked.yaml"
    study_file.write_text(yaml.safe_dump(LOCK_STUDY))
    results = tmp_path / "results"
    out = results / "locked"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # the first launcher's rank hangs at step 1 (tests/fault_injection.py) until the SIGINT
    # below: it holds the lock for as long as the test needs, however fast or loaded the host
    path = [str(REPO / "tests"), str(REPO / "src"),
            *filter(None, [os.environ.get("PYTHONPATH")])]
    hung = {**env, "SCALESTUDY_STEP_HOOK": "fault_injection:make_hook",
            "SCALESTUDY_FAULT": "hang:rank=0:step=1", "PYTHONPATH": os.pathsep.join(path)}
    # two launchers started at the same instant: one holds the study, the other is refused
    twins = [subprocess.Popen([sys.executable, "-m", "scalestudy.cli", "run", str(study_file),
                               "--results", str(results), "--no-report"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=hung, start_new_session=True, preexec_fn=as_from_a_terminal)
             for _ in range(2)]
    try:
        deadline = time.monotonic() + 300
        while all(t.poll() is None for t in twins):
            assert time.monotonic() < deadline, "neither twin ended"
            time.sleep(0.2)
        (twin,) = [t for t in twins if t.poll() is not None]
        (first,) = [t for t in twins if t is not twin]
        twin_err = twin.communicate(timeout=60)[1]
        while not guard.is_locked(out):
            assert first.poll() is None and time.monotonic() < deadline, "never took the lock"
            time.sleep(0.2)
        # the documented launcher (docs/getting-started.md), from the repository root, with its
        # own .snakemake folder
        second = subprocess.run(
            [sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/local",
             "--config", f"study={study_file}", f"results={results}"],
            cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        third = subprocess.run([sys.executable, "-m", "scalestudy.cli", "run", str(study_file),
                                "--results", str(results)], capture_output=True, text=True,
                               timeout=300, env=env)
        assert first.poll() is None  # still running: both refusals happened while it did
    finally:
        os.killpg(first.pid, signal.SIGINT)
        try:
            first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    refusal = (f"scalestudy: error: study locked is being run by another launcher (pid "
               f"{first.pid} on {socket.gethostname()} since ")
    assert twin.returncode == 2 and twin_err.count("\n") == 1, twin_err
    assert twin_err.startswith(refusal), twin_err
    assert f"or stop it (kill {first.pid} on {socket.gethostname()})" in twin_err
    # plain snakemake: the same one line, exit 2, no stack trace
    assert second.returncode == 2, second.stderr[-2000:]
    assert refusal in second.stderr and "Traceback" not in second.stderr
    assert "rule train:" not in second.stdout + second.stderr
    assert third.returncode == 2 and third.stderr.count("\n") == 1
    assert third.stderr.startswith(refusal)
    assert not guard.is_locked(out)  # the first launcher's end released it


# --- the hash ---------------------------------------------------------------------------------

def _hash(**platform) -> str:
    return config_hash(Point.for_layout(Model(), device="cpu", point_id="p",
                                        **{k: v for k, v in platform.items() if k != "site"},
                                        **({"site": platform["site"]} if "site" in platform
                                           else {})))


def test_settings_that_change_the_measurement_are_hashed_the_others_not():
    base = _hash()
    assert _hash(site={"env": {"OMP_NUM_THREADS": "4"}}) != base
    assert _hash(site={"env": {"OMP_NUM_THREADS": "4"}}) != _hash(site={"env": {"OMP_NUM_THREADS": "8"}})
    assert _hash(site={"cpus_per_proc": 4}) != base
    assert _hash(site={"cpus_per_proc": 1}) == base  # a CPU site's default: the same point
    assert _hash(site={"torchrun_extra": "--numa-binding=node"}) != base
    assert _hash(memory_limit_mb=2000) != base
    # unhashed: timeouts, partition and other allocation choices
    assert _hash(timeout_s=5, collective_timeout_s=7) == base
    assert _hash(site={"partition": "gpu", "account": "a", "qos": "q", "rdzv_port": 1234,
                       "runtime_margin_min": 9, "env": {}}) == base
    # a secret's value never enters the hash (only that the variable is set)
    a = _hash(site={"env": {"WANDB_API_TOKEN": "s3cret-1"}})
    assert a == _hash(site={"env": {"WANDB_API_TOKEN": "<redacted>"}}) != base
    assert Platform().memory_limit_mb is None  # (default points keep their ids)
