"""Process lifetime (``scalestudy.run.lifetime``): whatever level of a sweep is killed — the
``scalestudy run`` launcher, Snakemake, a point's runner — or interrupted (Ctrl-C), no process
of the sweep outlives it, a stopped rank and a workload's background child included; Ctrl-C ends
with one line and exit status 130; a rerun after a kill needs no ``--unlock``.

Each sweep is one point of a command workload under the real launcher (``scalestudy run`` →
Snakemake → runner → torchrun → ranks), whose rank starts a background child and sleeps. Every
process of the sweep carries a token in its environment, so a survivor is found whatever its
session or process group (torchrun gives each rank a session of its own); each wait is bounded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from conftest import as_from_a_terminal
from scalestudy.config.study import load_study
from scalestudy.plan.planner import plan_points

pytestmark = pytest.mark.workflow

TOKEN_ENV = "SCALESTUDY_TEST_SWEEP"
#: the rank: a shell with a background child and a child in the foreground (both outlive any
#: test; ``; true`` keeps the shell from exec-ing the last one)
RANK = "sleep 600 & sleep 600; true"


def _study(root: Path, name: str) -> tuple[Path, str]:
    """A one-point study of two ranks running :data:`RANK` in ``root/results``; returns (study
    file, the train job's target)."""
    study = {"name": name,
             "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
             "train": {"steps": 4, "warmup_steps": 1},
             "platform": {"device": "cpu", "devices_per_node": 4, "timeout_s": 900},
             "workload": {"command": ["sh", "-c", RANK]},
             "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [2],
                         "micro_batch": 1}]}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(study))
    (point,) = [p for p in plan_points(load_study(str(path)), str(path)) if p.feasible]
    return path, str(root / "results" / name / "runs" / point.point_id / "status.json")


def _processes(token: str) -> dict[int, str]:
    """The live (not zombie) processes whose environment holds ``token``: pid -> command."""
    found = {}
    needle = f"{TOKEN_ENV}={token}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def _wait(predicate, timeout: float, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def _one(procs: dict[int, str], part: str) -> int:
    (pid,) = [p for p, cmd in procs.items() if part in cmd][:1] or [None]
    assert pid is not None, f"no process {part!r} among {procs}"
    return pid


class Sweep:
    """``scalestudy run STUDY -- TARGET`` started as from a terminal, with its token."""

    def __init__(self, root: Path, name: str):
        self.study, self.target = _study(root, name)
        self.results = root / "results"
        self.token = uuid.uuid4().hex
        self.env = {**os.environ, TOKEN_ENV: self.token, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "scalestudy.cli", "run", str(self.study), "--results",
             str(self.results), "--no-report", "--", self.target],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
            start_new_session=True, preexec_fn=as_from_a_terminal)

    def training(self) -> dict[int, str]:
        """Wait until both ranks run their workload (their background children started)."""
        def ready():
            if self.proc.poll() is not None:  # the launcher ended first: fail now, say why
                return True
            procs = _processes(self.token)
            return procs if sum("sleep 600" == c.strip() for c in procs.values()) >= 4 else None
        procs = _wait(ready, 300)
        assert isinstance(procs, dict), f"the sweep never trained: {self.close()}"
        return procs

    def survivors(self, timeout: float = 60) -> dict[int, str]:
        """The sweep's processes still alive once none is, or ``timeout`` s have passed."""
        _wait(lambda: not _processes(self.token), timeout)
        return _processes(self.token)

    def close(self) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=120)
        finally:
            for pid in _processes(self.token):  # never leave a test's processes behind
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return self.proc.returncode, out, err


@pytest.mark.parametrize("victim", ["-m scalestudy.cli ", "-m snakemake ",
                                    "-m scalestudy run-point "])
def test_a_killed_level_takes_the_whole_sweep_with_it(tmp_path, victim):
    """SIGKILL of the launcher, of Snakemake or of the runner, with one rank stopped
    (SIGSTOP): no process of the sweep (torchrun, ranks, their background children) is left."""
    sweep = Sweep(tmp_path, "killed")
    procs = sweep.training()
    rank = max(p for p, c in procs.items() if c.startswith("sh -c"))
    os.kill(rank, signal.SIGSTOP)
    os.kill(_one(procs, victim), signal.SIGKILL)
    left = sweep.survivors()
    sweep.close()
    assert not left, f"alive 60 s after SIGKILL of {victim}: {left}"


def test_ctrl_c_ends_with_one_line_and_130_and_a_rerun_needs_no_unlock(tmp_path):
    sweep = Sweep(tmp_path, "ctrlc")
    sweep.training()
    os.killpg(sweep.proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the launcher's group
    left = sweep.survivors()
    rc, out, err = sweep.close()
    assert not left, f"alive after Ctrl-C: {left}"
    assert rc == 130, (rc, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.rstrip("\n").splitlines()[-1].startswith("scalestudy: interrupted;")
    assert not list((sweep.results / ".snakemake" / "locks").glob("*"))  # released


def test_a_rerun_after_a_kill_clears_snakemakes_stale_lock(tmp_path):
    """SIGKILL of Snakemake leaves its lock; the next run of the study removes it, says so,
    and runs (here: its plan, which the stale lock names) without --unlock."""
    sweep = Sweep(tmp_path, "rerun")
    procs = sweep.training()
    os.kill(_one(procs, "-m snakemake "), signal.SIGKILL)
    assert not sweep.survivors()
    rc, _, err = sweep.close()
    assert rc == 128 + signal.SIGKILL and "Snakemake was killed by SIGKILL" in err
    assert list((sweep.results / ".snakemake" / "locks").glob("*.lock"))  # left by the kill
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "run", str(sweep.study),
                        "--results", str(sweep.results), "--no-report", "--",
                        str(sweep.results / "rerun" / "plan.tsv"),
                        "--forcerun", "plan"],
                       capture_output=True, text=True, timeout=300, env=sweep.env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "scalestudy: removed Snakemake's stale lock" in r.stderr
    assert "--unlock" not in r.stderr + r.stdout
