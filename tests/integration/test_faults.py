"""Failures are data: classification of real failure logs, the runner's watchdog / retries /
memory limit, and fault injection on real runs through Snakemake (a killed rank, a hung
collective, a point over its memory limit), then an interrupted and resumed sweep and a second,
refused invocation on the same study.

Faults are injected by the test-only ``tests/fault_injection.py`` through the trainer's step
hook (``SCALESTUDY_STEP_HOOK=fault_injection:make_hook``, ``SCALESTUDY_FAULT=...``, tests/ on
the ranks' ``PYTHONPATH``); production code has no fault switch."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
import yaml

import fault_injection
from conftest import as_from_a_terminal
from scalestudy import cli
from scalestudy.run.snakemake import snakemake_argv
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.study import validate
from scalestudy.paths import profile
from scalestudy.plan.planner import plan_points
from scalestudy.record.states import RunState
from scalestudy.run import guard, lifetime, outcome, runner
from scalestudy.train import hooks

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------------
# Real log snippets, produced by this repo's trainer under torchrun (gloo, torch 2.13 CPU) with
# SCALESTUDY_FAULT (tests/fault_injection.py) / platform.memory_limit_mb; only the traceback
# frames and pids are cut.

KILLED_RANK_LOG = """\
scalestudy fault injection: rank 1 kill at step 3
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:48552: Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!
W1130 03:20:11.640000 7009 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7845 closing signal SIGTERM
E1130 03:20:11.923000 7009 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 4242) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
======================================================
scalestudy.train FAILED
------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_03:20:11
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 4242)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 4242
------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_03:20:11
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
======================================================
"""

HUNG_COLLECTIVE_LOG = """\
scalestudy fault injection: rank 1 hang at step 2
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms for recv operation to complete
W1130 03:22:23.913000 11117 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 12643 closing signal SIGTERM
"""

CPU_OOM_LOG = """\
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1024000000 bytes. Error code 12 (Cannot allocate memory)
E1130 03:18:42.208000 3923 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 4242) of binary: /work/main/.venv/bin/python
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_03:18:42
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4242)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
"""

# CUDA's allocator message (format of torch.OutOfMemoryError, torch 2.x)
CUDA_OOM_LOG = """\
[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 139.72 GiB of which 1.06 GiB is free.
"""

# rank 1 raised; rank 0 then only saw the connection close (which rank is the root cause?)
RANK_EXCEPTION_LOG = """\
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:48552: Connection reset by peer.
[rank1]: ValueError: shapes do not match
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4242)
"""


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_classify_killed_rank_names_the_rank_and_signal():
    state, reason = outcome.classify(1, False, _lines(KILLED_RANK_LOG), False)
    assert state == "crashed"
    assert reason.startswith("rank 1 was killed by SIGKILL"), reason


# torchrun saw rank 0's exception ("Connection closed by peer") in the same poll as rank 1's
# SIGKILL and named rank 0 first (torchrun 2.13's report, ranks forked; pids as 4242)
SAME_POLL_LOG = """\
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20613
scalestudy.train FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-08_02:56:39
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-08_02:56:39
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 4241)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_rank_killed_in_the_same_poll_as_its_peers_exception_is_the_cause():
    lines = _lines(SAME_POLL_LOG)
    state, reason = outcome.classify(1, False, lines, False)
    assert state == "crashed" and reason.startswith("rank 1 was killed by SIGKILL"), reason
    assert outcome.killed_by_sigkill(1, lines) == [4242]
    # a signal seen a poll later, or torchrun's own SIGTERM, is not the cause
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("time"))  # rank 1
    later = [*lines[:first], lines[first].replace(":39", ":40"), *lines[first + 1:]]
    assert outcome.root_cause(later)["rank"] == 0
    stopped = [ln.replace("-9 (pid: 4242)  (SIGKILL)", "-15 (pid: 4242)  (SIGTERM)")
               for ln in lines]
    assert outcome.root_cause(stopped)["rank"] == 0


def test_classify_hung_collective_is_a_timeout_even_if_the_watchdog_also_fired():
    for timed_out in (False, True):
        state, reason = outcome.classify(1, timed_out, _lines(HUNG_COLLECTIVE_LOG), False,
                                         collective_timeout_s=10)
        assert state == "timeout"
        assert "platform.collective_timeout_s=10 s" in reason
        assert "Timed out waiting 10000ms" in reason


def test_classify_oom_from_the_allocators_own_error():
    state, reason = outcome.classify(1, False, _lines(CPU_OOM_LOG), False)
    assert state == "oom" and "DefaultCPUAllocator: can't allocate memory" in reason
    state, reason = outcome.classify(1, False, _lines(CUDA_OOM_LOG), False)
    assert state == "oom" and "CUDA out of memory" in reason


def test_classify_root_cause_rank_exception_and_the_rest():
    state, reason = outcome.classify(1, False, _lines(RANK_EXCEPTION_LOG), False)
    assert (state, reason) == ("crashed", "[rank1]: ValueError: shapes do not match")
    assert state is RunState.CRASHED  # a RunState, equal to its string
    assert outcome.classify(None, True, [], False, timeout_s=30) == (
        "timeout", "watchdog: no result within platform.timeout_s=30 s; the point's processes "
        "were killed")
    assert outcome.classify(0, False, [], True) == ("ok", "")
    assert outcome.classify(0, False, [], False)[0] == "crashed"
    assert outcome.classify(-9, False, [], False) == (
        "crashed", "the launcher was killed by SIGKILL")


def test_classify_unprefixed_exception_beats_torchruns_child_failed_error():
    # one process: no "[rankN]:" prefix; torchrun's own ChildFailedError comes last
    log = ["FileNotFoundError: [Errno 2] No such file or directory: 'run/point.json'",
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "]
    assert outcome.classify(1, False, log, False) == ("crashed", log[0])


# the kernel OOM killer's lines (mm/oom_kill.c, Linux 6.x), pid 4242 as in KILLED_RANK_LOG
KERNEL_OOM_LINES = [
    "python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1234567kB, "
    "anon-rss:812345kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1800kB oom_score_adj:0",
]


def test_a_sigkill_is_an_oom_only_on_the_kernels_word():
    lines = _lines(KILLED_RANK_LOG)
    assert outcome.killed_by_sigkill(1, lines) == [4242]  # torchrun names the killed rank
    assert outcome.killed_by_sigkill(-9, []) == [None]  # the launcher itself
    assert outcome.killed_by_sigkill(1, _lines(CPU_OOM_LOG)) == []
    # no evidence: a crash, as before
    assert outcome.kernel_oom(1, lines, (0, "memory.events: oom_kill 3 -> 3"), []) is None
    assert outcome.kernel_oom(1, lines, None, KERNEL_OOM_LINES[:1]) is None
    # the memory cgroup counted a kill meanwhile
    assert outcome.kernel_oom(1, lines, (1, "m/memory.events: oom_kill 3 -> 4"), []) == \
        "memory cgroup m/memory.events: oom_kill 3 -> 4"
    # the kernel log names the killed rank's pid (another pid is another process's kill)
    assert outcome.kernel_oom(1, lines, None, KERNEL_OOM_LINES).startswith(
        "kernel log: Memory cgroup out of memory: Killed process 4242 (python)")
    other = [KERNEL_OOM_LINES[1].replace("4242", "999")]
    assert outcome.kernel_oom(1, lines, None, other) is None
    assert outcome.kernel_oom(-9, [], None, other) is not None  # the launcher: pid unknown
    # a kill that was no SIGKILL is not the OOM killer's
    assert outcome.kernel_oom(-15, [], (1, "x"), KERNEL_OOM_LINES) is None
    # Slurm's own word in the step's log is enough
    slurm = "slurmstepd: error: Detected 1 oom_kill event in StepId=17.0. Some of the step " \
            "tasks have been OOM Killed."
    assert outcome.kernel_oom(1, [slurm], None, []) == f"Slurm: {slurm}"
    assert outcome.oom_reason("rank 1 was killed by SIGKILL", "memory cgroup x").startswith(
        "out of memory: the kernel's OOM killer ended it (memory cgroup x); rank 1 was killed")


def test_the_memory_cgroup_counter_is_found_for_v1_and_v2(tmp_path):
    from scalestudy.run import oomkill

    v1 = tmp_path / "memory" / "a" / "b" / "memory.oom_control"
    v1.parent.mkdir(parents=True)
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    text = "9:name=systemd:/\n4:memory:/a/b\n1:cpu:/\n0::/\n"
    assert oomkill.memory_counter(text, tmp_path) == v1
    assert oomkill.read_oom_kills(v1) == 7
    v2 = tmp_path / "c" / "memory.events"
    v2.parent.mkdir()
    v2.write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\noom_group_kill 0\n")
    assert oomkill.memory_counter("0::/c\n", tmp_path) == v2
    assert oomkill.read_oom_kills(v2) == 1
    assert oomkill.memory_counter("0::/nowhere\n", tmp_path) is None
    assert oomkill.read_oom_kills(None) is None


def test_evidence_keeps_the_injection_and_root_cause_lines():
    ev = outcome.evidence(_lines(KILLED_RANK_LOG))
    assert any("fault injection" in ln for ln in ev)
    assert any("exitcode  : -9" in ln for ln in ev)


def test_fault_spec_parsing_and_matching():
    text = "kill:rank=1:step=3:match=kill_;hang:rank=2:step=1"
    assert fault_injection.parse_faults(text) == [
        {"kind": "kill", "rank": 1, "step": 3, "match": "kill_"},
        {"kind": "hang", "rank": 2, "step": 1, "match": ""}]
    pid = "kill_n2_x"
    assert fault_injection.fault_for(pid, 1, {"SCALESTUDY_FAULT": text})["kind"] == "kill"
    assert fault_injection.fault_for(pid, 2, {"SCALESTUDY_FAULT": text})["kind"] == "hang"
    assert fault_injection.fault_for(pid, 0, {"SCALESTUDY_FAULT": text}) is None
    assert fault_injection.fault_for(pid, 1, {}) is None  # inert by default
    fault_injection.inject_fault(None, 3)  # no fault: nothing happens
    with pytest.raises(ValueError, match="unknown fault 'explode'"):
        fault_injection.parse_faults("explode:rank=1")
    with pytest.raises(ValueError, match="bad option 'when=3'"):
        fault_injection.parse_faults("kill:when=3")


def test_the_trainers_step_hook_loads_the_fault_injection(monkeypatch):
    """What a rank does with the environment the fault tests give it: the trainer's hook
    (``scalestudy.train.hooks.step_hook``) is ``fault_injection.make_hook``'s, only for the
    faulty rank of a matching point; without ``SCALESTUDY_STEP_HOOK`` nothing is loaded."""
    point = Point.for_layout(Model(), dp=2, point_id="kill_n2_x")
    monkeypatch.setenv("SCALESTUDY_FAULT", "kill:rank=1:step=3:match=kill_")  # read by make_hook
    env = {"SCALESTUDY_STEP_HOOK": fault_injection.HOOK_SPEC}
    assert hooks.step_hook(point, 0, env) is None  # rank 0 has no fault
    assert hooks.step_hook(point.replace(point_id="good_n2_x"), 1, env) is None  # no match
    hook = hooks.step_hook(point, 1, env)
    assert callable(hook)
    for step in range(3):
        hook(step)  # before the fault's step: nothing happens
    assert hooks.step_hook(point, 1, {}) is None  # no SCALESTUDY_STEP_HOOK: no hook
    monkeypatch.delenv("SCALESTUDY_FAULT")
    assert hooks.step_hook(point, 1, env) is None  # no SCALESTUDY_FAULT: inert


def test_an_injected_kill_ends_the_process_with_sigkill():
    code = ("import fault_injection\n"
            "from scalestudy.config.point import Model, Point\n"
            "p = Point.for_layout(Model(), dp=2, point_id='kill_n2_x')\n"
            "hook = fault_injection.make_hook(p, 1)\n"
            "for step in range(5):\n"
            "    hook(step)\n"
            "    print('step', step, flush=True)\n")
    env = {**_env(), "SCALESTUDY_FAULT": "kill:rank=1:step=2:match=kill_"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    assert r.stdout.split("\n")[:2] == ["step 0", "step 1"] and "step 2" not in r.stdout
    assert "scalestudy fault injection: rank 1 kill at step 2" in r.stderr


def test_planner_copies_retries_into_points_unhashed():
    base = {"name": "r", "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16,
                                          "vocab": 64}},
            "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 1}]}
    p0 = plan_points(validate(base))[0]
    p2 = plan_points(validate(dict(base, retries=2)))[0]
    assert (p0.retries, p2.retries) == (0, 2)
    assert p0.point_id == p2.point_id  # a retry count does not change what is measured


# --------------------------------------------------------------------------------------------
# The runner around a stand-in launcher (a plain Python process; no torch): watchdog, retries,
# memory limit, stale records.

#: A stand-in's sound record of its point (``d``: the run folder): every step trains the
#: point's tokens, as the runner checks (``record.run_records.run_problem``).
WRITE_RECORD = ("import json\n"
                "p = json.loads((d / 'point.json').read_text())\n"
                "line = {'step_time_s': 0.01, 'loss': 1.0,"
                " 'tokens': p['global_batch'] * p['model']['seq_len']}\n"
                "(d / 'steps.jsonl').write_text(''.join(json.dumps(dict(line, step=i)) + '\\n'"
                " for i in range(p['train']['steps'])))\n"
                "(d / 'summary.json').write_text('{}')\n")


def _fake_point(tmp_path: Path, *, timeout_s=60.0, retries=0, memory_limit_mb=None) -> Path:
    point = Point.for_layout(Model(), device="cpu", timeout_s=timeout_s, collective_timeout_s=5,
                             memory_limit_mb=memory_limit_mb, retries=retries,
                             point_id="fake_n1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "point.json").write_text(point.json_text())
    return run_dir


@pytest.fixture
def fake_launch(monkeypatch):
    """Replace torchrun by ``python -c CODE`` (CODE sees RUN_DIR as sys.argv[1])."""
    def use(code: str):
        monkeypatch.setattr(runner.launch, "launch_argv",
                            lambda point, run_dir: [sys.executable, "-c", code, str(run_dir)])
        monkeypatch.setattr(runner.launch, "launch_env", lambda point, environ: {})
        monkeypatch.setattr(runner, "_TERM_GRACE_S", 2.0)
    return use


def test_watchdog_kills_the_whole_process_group(tmp_path, fake_launch):
    # the stand-in starts a grandchild (like torchrun's ranks), records its pid, and hangs
    fake_launch("import subprocess, sys, time, pathlib\n"
                "c = subprocess.Popen(['sleep', '600'])\n"
                "pathlib.Path(sys.argv[1], 'child.pid').write_text(str(c.pid))\n"
                "print('training...', flush=True)\n"
                "time.sleep(600)\n")
    # the watchdog must fire after the stand-in has started its child and printed (~0.1 s on an
    # idle host, seconds on a loaded 2-core one, too close to 3 s); the test waits, idle
    run_dir = _fake_point(tmp_path, timeout_s=10)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "timeout" and status["reason"].startswith("watchdog"), status
    assert status["exit_code"] is not None and status["exit_code"] < 0
    pid = int((run_dir / "child.pid").read_text())
    stat = Path(f"/proc/{pid}/stat")

    def gone() -> bool:  # or a zombie waiting to be reaped: either way it no longer runs
        try:
            return stat.read_text().split(") ")[1].startswith("Z")
        except (FileNotFoundError, ProcessLookupError):
            return True

    # the group's SIGKILL is delivered at once; a busy host may take a moment to finish the exit
    # of a grandchild whose parent died first (seen: state R, reparented to init): wait for its
    # exit itself (``_exited``: its pidfd, bounded), not for a clock
    assert _exited(pid) and gone(), "the hung rank outlived the watchdog"
    saved = json.loads((run_dir / "status.json").read_text())
    assert saved["state"] == "timeout" and "training..." in "\n".join(saved["evidence"])


def test_retries_rerun_crashes_but_not_ooms(tmp_path, fake_launch):
    # first attempt crashes, second succeeds (writes summary.json)
    fake_launch("import pathlib, sys\n"
                "d = pathlib.Path(sys.argv[1]); n = d.parent / 'tries'\n"
                "k = int(n.read_text()) if n.exists() else 0; n.write_text(str(k + 1))\n"
                "if k == 0: raise RuntimeError('flaky node')\n"
                + WRITE_RECORD)
    run_dir = _fake_point(tmp_path, retries=2)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "ok"
    assert [a["state"] for a in status["attempts"]] == ["crashed", "ok"]
    assert "flaky node" in status["attempts"][0]["reason"]


def test_a_record_that_is_not_its_points_run_is_invalid(tmp_path, fake_launch):
    """The launch ends well but its steps count half the point's tokens: the runner's status
    is ``invalid`` with the reason, not ``ok``."""
    fake_launch("import pathlib, sys\n"
                "d = pathlib.Path(sys.argv[1])\n"
                + WRITE_RECORD.replace("['seq_len']}", "['seq_len'] // 2}"))
    run_dir = _fake_point(tmp_path)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "invalid", status
    assert status["reason"].startswith("steps.jsonl: step 0 trained 32 tokens, the point "
                                       "trains 64 per step"), status["reason"]


def test_oom_is_not_retried_and_memory_limit_applies(tmp_path, fake_launch):
    # 400 MB under a 200 MB address-space limit: Python's own MemoryError
    fake_launch("x = bytearray(400 * 2**20)\n")
    run_dir = _fake_point(tmp_path, retries=2, memory_limit_mb=200)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "oom" and "MemoryError" in status["reason"], status
    assert len(status["attempts"]) == 1


def test_stale_records_and_temp_files_are_cleared_before_an_attempt(tmp_path, fake_launch):
    fake_launch("import pathlib, sys, os\n"
                "d = pathlib.Path(sys.argv[1])\n"
                "print(sorted(p.name for p in d.iterdir()))\n"
                + WRITE_RECORD)
    run_dir = _fake_point(tmp_path)
    for name in ("summary.json", "steps.jsonl", "status.json", ".summary.abc.json"):
        (run_dir / name).write_text("half")
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "ok"
    log = (run_dir / "stdout.log").read_text()
    # nothing of the old attempt was left: the point's lock and the launch's TMPDIR are new
    assert "['.point.lock', 'point.json', 'stdout.log', 'tmp']" in log


def test_a_killed_writers_trace_temp_is_removed_and_never_read(tmp_path, fake_launch):
    """A trace temp (train/profile.py's ``traces/.rankN.PID.tmp.json.gz``) left by a killed
    runner is gone before the next attempt starts, and one left by a rank killed while
    writing it is gone when the attempt ends."""
    fake_launch("import os, pathlib, signal, sys\n"
                "d = pathlib.Path(sys.argv[1]) / 'traces'\n"
                "print('before:', sorted(p.name for p in d.iterdir()), flush=True)\n"
                "(d / f'.rank1.{os.getpid()}.tmp.json.gz').write_bytes(b'half a trace')\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n")
    run_dir = _fake_point(tmp_path)
    (run_dir / "traces").mkdir()
    (run_dir / "traces" / ".rank0.999999.tmp.json.gz").write_bytes(b"cut")  # a killed runner's
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "crashed", status
    assert "before: []" in (run_dir / "stdout.log").read_text()
    assert not list((run_dir / "traces").iterdir())
    from scalestudy.record import trace_terms as breakdown

    (run_dir / "traces" / ".rank0.1.tmp.json.gz").write_bytes(b"x")
    assert breakdown.trace_files(run_dir) == []  # the breakdown's glob never takes a temp


def test_a_workloads_own_link_is_left_alone_and_recorded(tmp_path, fake_launch):
    """A launch that links its data set into its run folder (``ln -s $DATA data``): the point
    is ok, its record names the link, the link and the data are untouched (never followed or
    written through, a rerun included), and the study folder is not refused for it; a link
    where scalestudy writes (a record, the run folder itself) still is."""
    from scalestudy.record.io import escaping_links
    from scalestudy.record.bounded_read import RecordError

    data = tmp_path / "dataset"
    data.mkdir()
    (data / "rank0.json.gz").write_bytes(b"not a trace of ours")
    (data / ".summary.1.json").write_text("theirs")
    fake_launch("import os, pathlib, sys\n"
                "d = pathlib.Path(sys.argv[1])\n"
                f"os.path.lexists(d / 'data') or os.symlink({str(data)!r}, d / 'data')\n"
                + WRITE_RECORD)
    study = tmp_path / "study"  # the study folder, which holds the run folder
    study.mkdir()
    run_dir = _fake_point(study)
    for _ in range(2):  # the rerun of a point whose folder holds the link
        status = runner.run_point(run_dir / "point.json", run_dir)
        assert status["state"] == "ok", status
        assert status["links_left_alone"] == [f"data -> {data}"]
    assert sorted(p.name for p in data.iterdir()) == [".summary.1.json", "rank0.json.gz"]
    assert escaping_links(study) == []
    guard.refuse_escaping_links(study)
    (run_dir / "steps.jsonl").unlink()
    (run_dir / "steps.jsonl").symlink_to(data / "rank0.json.gz")  # where a record goes
    with pytest.raises(RecordError, match="steps.jsonl is a symlink to"):
        guard.refuse_escaping_links(study)


@contextmanager
def memory_cgroup(limit_mb: int):
    """A new memory cgroup of ``limit_mb`` MB (no swap) beside this process's own, removed
    after the block; the test is skipped where the host offers none to make (not root, no
    memory controller, cgroup v2 without it delegated)."""
    from scalestudy.run import oomkill

    counter = oomkill.memory_counter()
    if counter is None:
        pytest.skip("no memory cgroup counter readable here (/proc/self/cgroup)")
    group = counter.parent / f"scalestudy-oom-test-{os.getpid()}"
    limits = ({"memory.limit_in_bytes": limit_mb * 2**20, "memory.memsw.limit_in_bytes":
               limit_mb * 2**20} if counter.name == "memory.oom_control"
              else {"memory.max": limit_mb * 2**20, "memory.swap.max": 0})
    try:
        group.mkdir()
        for name, value in limits.items():
            if name == "memory.memsw.limit_in_bytes" and not (group / name).exists():
                continue  # v1 without swap accounting
            (group / name).write_text(str(value))
    except OSError as e:
        if group.exists():
            group.rmdir()
        pytest.skip(f"cannot make a memory cgroup beside {counter.parent} here: {e}")
    try:
        yield group
    finally:
        for _ in range(100):  # its last process may still be exiting
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


#: The runner with the stand-in launch, started inside a cgroup (argv: cgroup, run folder,
#: the launch's code).
IN_CGROUP = ("import os, sys, pathlib\n"
             "pathlib.Path(sys.argv[1], 'cgroup.procs').write_text(str(os.getpid()))\n"
             "from scalestudy.run import runner\n"
             "runner.launch.launch_argv = lambda p, d: [sys.executable, '-c', sys.argv[3], str(d)]\n"
             "runner.launch.launch_env = lambda p, environ: {}\n"
             "d = pathlib.Path(sys.argv[2])\n"
             "runner.run_point(d / 'point.json', d)\n")


def test_a_kernel_oom_kill_under_a_cgroup_limit_is_an_oom(tmp_path):
    """A real memory cgroup limit (as Slurm's task/cgroup sets one): the launch touches 800 MB
    under 300 MB, the kernel's OOM killer SIGKILLs it; the status says oom, with the cgroup's
    own count as evidence, not a crash by SIGKILL."""
    run_dir = _fake_point(tmp_path)
    with memory_cgroup(300) as group:
        r = subprocess.run([sys.executable, "-c", IN_CGROUP, str(group), str(run_dir),
                            "x = b'1' * (800 * 2**20)\n"], capture_output=True, text=True,
                           timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "oom", status
    assert status["reason"].startswith("out of memory: the kernel's OOM killer ended it "
                                       "(memory cgroup "), status["reason"]
    assert "oom_kill 0 -> 1" in status["reason"] and "SIGKILL" in status["reason"]
    assert any(ln.startswith("memory cgroup ") for ln in status["evidence"])
    assert len(status["attempts"]) == 1  # an oom is not retried


def _exited(pid: int, timeout: float = 120.0) -> bool:
    """Whether ``pid`` exits (a zombie included) within ``timeout`` s: its pidfd turns readable
    at the exit; a killed grandchild may take a moment on a busy host."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # exited and reaped already
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_a_points_log_is_capped_its_tmpdir_is_its_own_and_no_child_outlives_it(
        tmp_path, fake_launch, monkeypatch):
    """The launch writes 3 MB, puts a file into its TMPDIR and leaves a background child in its
    process group: stdout.log keeps its head and tail with the cut in status.json, the TMPDIR
    was the run folder's ``tmp`` (gone after the attempt), and the child is ended."""
    monkeypatch.setattr(runner.capture, "HEAD_BYTES", 64 << 10)
    monkeypatch.setattr(runner.capture, "TAIL_BYTES", 64 << 10)
    fake_launch("import os, pathlib, subprocess, sys\n"
                "d = pathlib.Path(sys.argv[1])\n"
                "c = subprocess.Popen(['sleep', '600'])\n"
                "(d / 'child.pid').write_text(str(c.pid))\n"
                "(d / 'tmpdir').write_text(os.environ['TMPDIR'])\n"
                "pathlib.Path(os.environ['TMPDIR'], 'scratch').write_text('x')\n"
                "for i in range(30000):\n"
                "    print(f'line {i:06d} ' + 'x' * 88)\n"
                + WRITE_RECORD)
    run_dir = _fake_point(tmp_path)
    status = runner.run_point(run_dir / "point.json", run_dir)
    assert status["state"] == "ok", status
    log = (run_dir / "stdout.log").read_bytes()
    assert status["log_cut_bytes"] > 2_000_000 and len(log) < 300_000
    assert b"bytes of output cut here" in log and log.endswith(b"line 029999 " + b"x" * 88 + b"\n")
    assert (run_dir / "tmpdir").read_text() == str(run_dir / "tmp")
    assert not (run_dir / "tmp").exists()
    assert _exited(int((run_dir / "child.pid").read_text())), "the background child outlived it"


def test_a_runner_error_is_still_a_status(tmp_path, monkeypatch):
    def broken(point, run_dir):
        raise ValueError("site.gpu_request: 'x'; use one of ('gres',)")
    monkeypatch.setattr(runner.launch, "launch_argv", broken)
    run_dir = _fake_point(tmp_path)
    assert cli.main(["run-point", str(run_dir / "point.json"), str(run_dir)]) == 0
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "crashed"
    assert status["reason"].startswith("runner error: ValueError: site.gpu_request")
    bad = tmp_path / "nope"
    assert cli.main(["run-point", str(bad / "point.json"), str(bad)]) == 0  # unreadable point.json
    assert json.loads((bad / "status.json").read_text())["reason"].startswith(
        "runner error: FileNotFoundError")


# --------------------------------------------------------------------------------------------
# Real runs through Snakemake.

FAULTY = {
    "name": "faulty",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64},
               # the math kernel's attention scores of one sequence, 4 heads x 16384^2 fp32:
               # 4.3e9 bytes alone, far over the memory limit below (its matrix products
               # are small: the calibrate job times them in a second)
               "huge": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16384,
                        "vocab": 64, "attention": "math"}},
    "train": {"steps": 4, "warmup_steps": 1},
    "platform": {"device": "cpu", "devices_per_node": 4, "collective_timeout_s": 6,
                 "timeout_s": 300, "memory_limit_mb": 2500},
    "series": [
        {"name": "good", "mode": "weak", "model": "m", "gpus": [1], "micro_batch": 2},
        {"name": "kill", "mode": "weak", "model": "m", "gpus": [2], "micro_batch": 1},
        {"name": "hang", "mode": "weak", "model": "m", "gpus": [2], "micro_batch": 1,
         "grad_accum": 2},
        # N=1 over the memory limit; N=3 cannot split global_batch 2 (infeasible)
        {"name": "big", "mode": "strong", "model": "huge", "gpus": [1, 3], "micro_batch": 1,
         "global_batch": 2},
    ],
}
FAULTS = "kill:rank=1:step=2:match=kill_;hang:rank=1:step=1:match=hang_"
N_JOBS = 4  # training jobs: good/1, kill/2, hang/2, big/1 (big/3 is infeasible)
EXPECTED = {"good": "ok", "kill": "crashed", "hang": "timeout", "big": "oom"}
FIGURES = ["efficiency_weak", "efficiency_strong", "throughput", "mfu"]


def _env() -> dict:
    """The sweep's environment: the faults, and this module's directory on the ranks' path
    (the runner passes its environment on to torchrun)."""
    path = [str(TESTS), str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "SCALESTUDY_STEP_HOOK": fault_injection.HOOK_SPEC,
            "SCALESTUDY_FAULT": FAULTS, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(path)}


def _argv(study_file: Path, results: Path, *extra: str) -> list[str]:
    return snakemake_argv(str(study_file), str(results), str(profile("local")), list(extra))


def _trained(out: str) -> int:
    return out.count("rule train:")


def _statuses(study_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in (study_dir / "runs").glob("*/status.json")}


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    study_file = root / "faulty.yaml"
    study_file.write_text(yaml.safe_dump(FAULTY))
    return root, study_file


@pytest.fixture(scope="module")
def resumed(faulty):
    """One sweep of the faulty study, the way a user lives it: started, refused a second
    invocation while it runs, interrupted (Ctrl-C) after a point has finished and while the
    next trains, then run again to the end. Returns ``(study_dir, interruption, final run)``:
    ``interruption`` holds the finished times of the points done before the Ctrl-C, the second
    invocation's result, and the lock and temp files left by the interruption."""
    root, study_file = faulty
    results = root / "b"
    out = results / "faulty"
    proc = subprocess.Popen(_argv(study_file, results), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(),
                            start_new_session=True, preexec_fn=as_from_a_terminal)
    second = None
    try:
        # a second invocation on the same study while the first runs: refused, by the lock
        # (started as soon as the first holds it, so that a slow host cannot let the sweep end
        # before the refusal)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not guard.is_locked(out):
            time.sleep(0.2)
        second = subprocess.Popen(
            [sys.executable, "-m", "scalestudy.cli", "run", str(study_file), "--results",
             str(results)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        # wait until the second was refused, a point has finished and the next one is training
        while time.monotonic() < deadline and proc.poll() is None:
            done = _statuses(out)
            running = [d for d in (out / "runs").glob("*") if (d / "stdout.log").exists()
                       and not (d / "status.json").exists()] if (out / "runs").exists() else []
            if done and running and second.poll() is not None:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the sweep ended before it could be interrupted"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole group
        proc.communicate(timeout=120)
        out_2, err_2 = second.communicate(timeout=300)
        second = subprocess.CompletedProcess(second.args, second.returncode, out_2, err_2)
    finally:
        for p in (proc, second):
            if isinstance(p, subprocess.Popen) and p.poll() is None:
                p.kill() if p is second else os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    interruption = {
        "finished": {pid: st["finished"] for pid, st in _statuses(out).items()},
        "second": second,
        "locks": list((results / ".snakemake" / "locks").glob("*")),
        "study_locked": guard.is_locked(out),
        "temp_files": [p for p in (out / "runs").rglob(".*")
                       if p.is_file() and p.name != lifetime.POINT_LOCK],
    }
    t0 = time.monotonic()
    final = subprocess.run(_argv(study_file, results), capture_output=True, text=True,
                           timeout=900, env=_env())
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    print(f"resumed fault sweep: {time.monotonic() - t0:.0f} s")
    return out, interruption, final


@pytest.mark.workflow
def test_faulty_points_carry_their_state_and_the_rest_is_intact(resumed):
    out, interruption, r = resumed
    assert _trained(r.stdout + r.stderr) == N_JOBS - len(interruption["finished"])
    statuses = _statuses(out)
    assert len(statuses) == N_JOBS
    for pid, st in statuses.items():
        series = pid.split("_")[0]
        assert st["state"] == EXPECTED[series], (pid, st)
        assert set(st) >= {"state", "reason", "evidence", "exit_code", "started", "finished"}
        if st["state"] != "ok":
            assert st["reason"] and st["evidence"], st
    by = {pid.split("_")[0]: st for pid, st in statuses.items() if "_n2_" in pid or "big" in pid}
    assert by["kill"]["reason"].startswith("rank 1 was killed by SIGKILL")
    assert by["hang"]["reason"].startswith("collective timeout")
    assert "Timed out waiting 6000ms" in by["hang"]["reason"]
    assert "DefaultCPUAllocator: can't allocate memory" in by["big"]["reason"]

    runs = pd.read_csv(out / "runs.csv")
    got = dict(zip(runs["series"] + "/" + runs["n"].astype(str), runs["status"]))
    assert got == {"good/1": "ok", "kill/2": "crashed", "hang/2": "timeout",
                   "big/1": "oom", "big/3": "infeasible"}
    assert runs.loc[runs["status"] == "ok", "tokens_per_s_per_device"].gt(0).all()
    for pid in runs.loc[runs["series"] == "good", "point_id"]:  # intact records
        run = out / "runs" / pid
        assert len((run / "steps.jsonl").read_text().splitlines()) == 4
        assert json.loads((run / "summary.json").read_text())["steps"] == 4

    eff = pd.read_csv(out / "efficiency.csv")
    good = eff[eff["series"] == "good"].set_index("n")
    assert good.loc[1, "efficiency"] == pytest.approx(1.0, abs=1e-12)
    assert set(eff["status"]) >= {"ok", "crashed", "timeout", "oom", "infeasible"}

    for fig in FIGURES:
        for ext in ("png", "pdf", "csv"):
            assert (out / "figures" / f"{fig}.{ext}").stat().st_size > 0
    weak = pd.read_csv(out / "figures" / "efficiency_weak.csv")
    strong = pd.read_csv(out / "figures" / "efficiency_strong.csv")
    assert {"crashed", "timeout"} <= set(weak["status"])  # drawn as markers
    assert {"oom", "infeasible"} <= set(strong["status"])


@pytest.mark.workflow
def test_interrupted_sweep_resumes_and_a_second_invocation_is_refused(resumed):
    out, interruption, r = resumed
    second = interruption["second"]
    assert second.returncode == 2 and second.stderr.count("\n") == 1  # the study's lock
    assert second.stderr.startswith(
        "scalestudy: error: study faulty is being run by another launcher (pid")

    finished = interruption["finished"]
    assert 0 < len(finished) < N_JOBS, finished
    assert not interruption["locks"] and not interruption["study_locked"]  # both released
    assert not interruption["temp_files"]  # no temp files of cut writes
    # the resumed run trained only the unfinished points and left the finished ones untouched
    assert _trained(r.stdout + r.stderr) == N_JOBS - len(finished)
    after = _statuses(out)
    assert {pid: after[pid]["finished"] for pid in finished} == finished


# --------------------------------------------------------------------------------------------
# A point cut without a record, the tables aggregated, then the study run again.

def _runner_pid(run_dir: Path, old: str) -> int | None:
    """The pid of the runner that holds the point's lock now (its file says "pid N"; ``old``:
    the text a previous runner left there)."""
    try:
        text = (run_dir / lifetime.POINT_LOCK).read_text()
        cmd = Path(f"/proc/{text.split()[1]}/cmdline").read_bytes()
    except (OSError, IndexError):
        return None
    return int(text.split()[1]) if text != old and b"run-point" in cmd else None


@pytest.mark.workflow
def test_a_point_cut_before_an_aggregate_is_rerun_and_links_are_left_alone(tiny_study_run,
                                                                          tmp_path):
    """A point whose runner is SIGKILLed (as the OOM killer or a cancelled job does: no
    record), then ``scalestudy aggregate`` (tables newer than the missing record), then
    ``scalestudy run``: the point is trained once and ok. Meanwhile a killed trace writer's temp
    sits in its traces/, and a finished point's folder holds a link to a data set outside the
    results (``ln -s $DATA data``): the temp is gone, the link and its data untouched, the
    plots drawn."""
    from conftest import trained

    shared_study, shared_results, _ = tiny_study_run
    study_file, results = tmp_path / "tiny.yaml", tmp_path / "results"
    shutil.copy2(shared_study, study_file)
    shutil.copytree(shared_results, results, symlinks=True)
    (results / "tiny" / "study.json").unlink()  # this copy takes the folder over
    out = results / "tiny"
    cut = next(p for p in (out / "runs").iterdir() if "weak_n2" in p.name)
    kept = next(p for p in (out / "runs").iterdir() if "weak_n1" in p.name)
    kept_status = (kept / "status.json").read_bytes()
    old_lock = (cut / lifetime.POINT_LOCK).read_text()
    (cut / "status.json").unlink()

    # the cut: the point's runner SIGKILLed while it trains
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sm = subprocess.Popen(_argv(study_file, results, str(cut / "status.json")),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while (pid := _runner_pid(cut, old_lock)) is None:
            assert sm.poll() is None and time.monotonic() < deadline, sm.communicate()[0][-3000:]
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        sm.communicate(timeout=300)
    finally:
        if sm.poll() is None:
            os.killpg(sm.pid, signal.SIGKILL)
            sm.wait()
    assert not (cut / "status.json").exists()
    (cut / "traces").mkdir(exist_ok=True)
    (cut / "traces" / ".rank1.999999.tmp.json.gz").write_bytes(b"half a trace")  # a killed writer's
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "train.jsonl").write_text('{"text": "mine"}\n')
    (kept / "data").symlink_to(data)

    cli = [sys.executable, "-m", "scalestudy.cli"]
    agg = subprocess.run(cli + ["aggregate", str(out)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert agg.returncode == 0, agg.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv").set_index("point_id")
    assert runs.loc[cut.name, "status"] == "not_run"
    time.sleep(0.05)  # the tables strictly newer than anything the cut left

    r = subprocess.run(cli + ["run", str(study_file), "--results", str(results), "--no-report"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert trained(r.stdout + r.stderr) == 1
    assert json.loads((cut / "status.json").read_text())["state"] == "ok"
    runs = pd.read_csv(out / "runs.csv").set_index("point_id")
    assert runs.loc[cut.name, "status"] == "ok"
    assert (kept / "status.json").read_bytes() == kept_status  # not trained again
    assert not [p.name for p in (cut / "traces").iterdir() if p.name.startswith(".")]
    assert os.readlink(kept / "data") == str(data)
    assert (data / "train.jsonl").read_text() == '{"text": "mine"}\n'
    assert sorted(p.name for p in data.iterdir()) == ["train.jsonl"]
    for fig in FIGURES:
        assert (out / "figures" / f"{fig}.png").stat().st_mtime > (out / "runs.csv").stat().st_mtime - 1
