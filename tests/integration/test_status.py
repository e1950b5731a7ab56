"""``scalestudy status`` on run records: a copy of the shared tiny study run, then records
edited into every state a live study passes through (running, pending, failed, interrupted),
as Snakemake would leave them mid-run, locally or on Slurm."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import as_from_a_terminal
from scalestudy import cli
from scalestudy.report import status

pytestmark = pytest.mark.workflow

OOM_LINE = ("[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:121] data. "
            "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1048576 bytes.")


@pytest.fixture
def live(tiny_study_run, tmp_path):
    """The tiny study's records as they were mid-run: weak N=2 running, strong N=2 not started,
    strong N=1 out of memory, weak N=1 ok."""
    _, results, _ = tiny_study_run
    d = tmp_path / "tiny"
    shutil.copytree(results / "tiny", d, ignore=shutil.ignore_patterns("report.html"))
    runs = {p.name.split("_")[0] + p.name.split("_")[1]: p for p in (d / "runs").iterdir()}
    (runs["weakn2"] / "status.json").unlink()
    for name in ("steps.jsonl", "summary.json", "env.json"):
        (runs["weakn2"] / name).unlink()
    shutil.rmtree(runs["strongn2"])
    st = json.loads((runs["strongn1"] / "status.json").read_text())
    st.update(state="oom", reason=f"out of memory: {OOM_LINE}")
    (runs["strongn1"] / "status.json").write_text(json.dumps(st))
    with open(runs["strongn1"] / "stdout.log", "a") as f:
        f.write(OOM_LINE + "\nW1201 torch/distributed/elastic: Sending process 1 closing signal SIGTERM\n")
    return d, runs


def test_states_time_left_and_last_error(live):
    d, runs = live
    st = status.snapshot(d)
    assert st.study == "tiny" and not st.done
    c = st.counts
    assert (c["ok"], c["oom"], c["running"], c["pending"], c["infeasible"]) == (1, 1, 1, 1, 1)
    by_id = {p.point_id: p for p in st.points}
    running = by_id[runs["weakn2"].name]
    assert running.state == "running" and running.elapsed_s is not None
    failed = by_id[runs["strongn1"].name]
    assert failed.state == "oom" and failed.last_error == OOM_LINE
    # every unfinished point is priced: the model (cpu-local + calibration.json), scaled by the
    # measured point, plus its measured start-up
    assert all(p.estimate_s is not None and p.estimate_s >= 0 for p in st.points
               if p.state in ("running", "pending"))
    assert st.time_left_s is not None and st.time_left_s > 0
    assert "performance model (cpu-local + calibration.json)" in st.estimate
    assert st.elapsed_s is not None and st.elapsed_s > 0

    text = status.text(st)
    assert "1 ok, 1 failed (oom 1), 1 running, 1 pending, 1 infeasible" in text
    assert "left (performance model" in text
    assert f"strong N=1 r0  oom: out of memory: {OOM_LINE}" in text
    assert f"weak N=2 r0  {runs['weakn2'].name}  running" in text
    doc = json.loads(status.as_json(st))
    assert doc["counts"]["running"] == 1 and doc["done"] is False
    assert {p["state"] for p in doc["points"]} == {"ok", "oom", "running", "pending", "infeasible"}


def test_a_silent_point_is_interrupted_not_running(live):
    d, runs = live
    old = time.time() - 3600  # older than platform.timeout_s (900 s) + grace
    for p in (runs["weakn2"] / "stdout.log", runs["weakn2"]):
        os.utime(p, (old, old))
    st = status.snapshot(d)
    p = next(p for p in st.points if p.point_id == runs["weakn2"].name)
    assert p.state == "interrupted" and "the next run reruns it" in p.reason
    assert st.counts["running"] == 0 and "interrupted" in status.text(st)


def test_a_finished_study_and_a_study_file(tiny_study_run, capsys):
    study_file, results, _ = tiny_study_run
    assert cli.main(["status", str(study_file), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "4 ok, 0 failed, 0 running, 0 pending, 1 infeasible" in out and "; done" in out
    assert cli.main(["status", str(results), "--json"]) == 0  # a results root with one study
    assert json.loads(capsys.readouterr().out)["done"] is True
    assert cli.main(["status", str(results / "nope")]) == 2
    assert "neither a study file nor" in capsys.readouterr().err


def test_before_the_plan_is_written_every_point_is_pending(tiny_study_run, tmp_path):
    study_file, _, _ = tiny_study_run
    from scalestudy.config.study import load_study

    st = status.snapshot(tmp_path / "tiny", load_study(study_file))
    assert st.counts["pending"] == 4 and st.counts["infeasible"] == 1
    assert st.time_left_s is not None  # the model alone prices them
    assert "alone (no point finished yet" in st.estimate


def test_watch_refreshes_and_ctrl_c_is_clean(live):
    d, _ = live
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "scalestudy.cli", "status", str(d),
                             "--watch", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, preexec_fn=as_from_a_terminal)
    try:
        first = proc.stdout.readline()
        assert first.startswith("study tiny")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err
    # bounded: --max-updates ends it by itself
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "status", str(d), "--watch",
                        "0.1", "--max-updates", "2", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.count('"study": "tiny"') == 2
