"""Ranks forked from a preloaded process (``scalestudy.run.forked_ranks``) are what torchrun's
exec'd ranks are: children of the agent in a session of their own, with torchrun's argv,
environment, stdout/stderr files and the point's lock; their exit code (negative: the
signal) reaches the agent; they die with it. Which launches fork: the built-in trainer on a
CPU point only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy.run import forked_ranks

ROOT = Path(__file__).resolve().parents[2]
#: The agent: forks its zygote, then one rank of ``forked_probe`` (tests/forked_probe.py),
#: and prints what it saw as JSON; MODE ``kill``: kills the rank; ``die``: ends itself hard.
AGENT = r"""
import json, os, signal, sys, time
from scalestudy.run import forked_ranks
mode, out, err, lock = sys.argv[1:]
zygote = forked_ranks.start(lambda: None)
lock_fd = os.open(lock, os.O_RDONLY)  # (opened after the zygote: the zygote has no copy)
rank = zygote.start_rank([sys.executable, "-u", "-m", "forked_probe",
                          "sleep" if mode in ("kill", "die") else "exit"],
                         {**os.environ, "PROBE": "from-torchrun"}, open(out, "w"),
                         open(err, "w"), (lock_fd,))
seen = {"agent": os.getpid(), "zygote": zygote.pid, "rank": rank.pid, "lock": lock_fd}
if mode == "die":
    while not open(out).read():
        time.sleep(0.01)
    print(json.dumps(seen), flush=True)
    os._exit(0)
if mode == "kill":
    while not open(out).read():
        time.sleep(0.01)
    assert rank.poll() is None
    os.killpg(rank.pid, signal.SIGKILL)
seen["code"] = rank.wait(60)
print(json.dumps(seen))
"""


def _agent(tmp_path: Path, mode: str) -> tuple[dict, dict, str]:
    out, err, lock = tmp_path / "out.log", tmp_path / "err.log", tmp_path / "lock"
    lock.write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    r = subprocess.run([sys.executable, "-c", AGENT, mode, str(out), str(err), str(lock)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rank = json.loads(out.read_text().splitlines()[0])
    return json.loads(r.stdout.splitlines()[-1]), rank, err.read_text()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and prctl: Linux")
def test_a_forked_rank_is_the_agents_child_as_popen_would_start_it(tmp_path):
    seen, rank, err = _agent(tmp_path, "exit")
    assert rank["pid"] == seen["rank"] and rank["ppid"] == seen["agent"]  # not the zygote's
    assert rank["sid"] == rank["pid"]  # a session (and process group) of its own
    assert rank["name"] == "__main__" and rank["argv"] == ["exit"]
    assert rank["probe"] == "from-torchrun"
    # the lock under its number, nothing else of the agent's or the zygote's (beside the
    # descriptor of the listing itself)
    assert len(rank["fds"]) == 5 and {0, 1, 2, seen["lock"]} < set(rank["fds"]), rank["fds"]
    assert rank["sigterm_default"] and rank["sigint_default"]
    assert err == "probe on stderr\n"
    assert seen["code"] == 3


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and prctl: Linux")
def test_a_killed_rank_reports_its_signal_as_popen_does(tmp_path):
    seen, _, _ = _agent(tmp_path, "kill")
    assert seen["code"] == -signal.SIGKILL


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and prctl: Linux")
def test_the_rank_and_the_zygote_die_with_the_agent(tmp_path):
    seen, rank, _ = _agent(tmp_path, "die")
    deadline = time.monotonic() + 10
    while (_alive(seen["rank"]) or _alive(seen["zygote"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(seen["rank"]) and not _alive(seen["zygote"])


def _point(tmp_path: Path, device: str) -> str:
    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model
    from scalestudy.record.io import write_json

    point = Point.for_layout(Model(vocab=64, seq_len=16, layers=2, hidden=32, heads=4),
                             device=device, dp=2)
    path = tmp_path / f"{device}.json"
    write_json(path, point.to_json())
    return str(path)


def test_only_the_builtin_trainer_on_a_cpu_point_forks(tmp_path):
    cpu, gpu = _point(tmp_path, "cpu"), _point(tmp_path, "cuda")
    head = ["--nnodes", "1", "--nproc-per-node", "2"]
    assert forked_ranks.serves([*head, "-m", "scalestudy.train", cpu, str(tmp_path)])
    assert not forked_ranks.serves([*head, "-m", "scalestudy.train", gpu, str(tmp_path)])
    assert not forked_ranks.serves([*head, "--no-python", "python", "train.py", cpu])
    assert not forked_ranks.serves([*head, "-m", "scalestudy.train", str(tmp_path / "none"),
                                    str(tmp_path)])
    assert forked_ranks.is_trainer_argv([sys.executable, "-u", "-m", "scalestudy.train", cpu,
                                         str(tmp_path)])
    assert not forked_ranks.is_trainer_argv(["python", "train.py", cpu, str(tmp_path)])
