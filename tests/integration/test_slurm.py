"""Against a real Slurm on this machine (scripts/slurm-local.sh: two emulated nodes).

1. A hand-written sbatch job runs a 2-node x 2-process all-reduce through ``launch_argv``
   (srun, one torchrun per node, c10d rendezvous on the first node), as a GPU point: the job
   asks for the fake GPUs per node (--gres=gpu:2) and every rank must see both of its node's.
2. A tiny study through ``snakemake --profile workflow/profiles/slurm-ci`` end to end, with a
   point on 2 nodes x 2 processes, gives the points a local run plans, every one ``ok``, and
   the tables a local run writes.

Skipped with the reason where Slurm cannot start (not root, not installed, start fails);
``SCALESTUDY_REQUIRE_SLURM=1`` (CI) turns that skip into a failure. Every step has a hard
timeout and the daemons are always stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from scalestudy.run import launch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-local.sh"
CI_PROFILE = REPO / "workflow" / "profiles" / "slurm-ci"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 120

# The tests that need a running Slurm are marked ``slurm`` (timeout 1500 s); the rest of this
# module checks, without one, what they rely on.

STUDY = {
    "name": "slurmci",
    "description": "Tiny study for the Slurm test: one point on 2 nodes x 2 processes.",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 6, "warmup_steps": 2},
    # 2 processes per node, 2 nodes: N=4 spans both emulated nodes
    "platform": {"device": "cpu", "devices_per_node": 2, "max_nodes": 2, "timeout_s": 400},
    "series": [{"name": "weak", "mode": "weak", "model": "m", "gpus": [1, 4],
                "micro_batch": 2}],
}


def _skip_or_fail(reason: str):
    if os.environ.get("SCALESTUDY_REQUIRE_SLURM") == "1":
        pytest.fail(f"SCALESTUDY_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


def _script(cmd: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), cmd], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def slurm():
    """A running local Slurm for this module; environment for its clients."""
    if os.geteuid() != 0:
        _skip_or_fail("a local Slurm needs root (slurmd starts jobs as their owner)")
    missing = [c for c in ("slurmctld", "slurmd", "sbatch", "munged") if not shutil.which(c)]
    if missing:
        _skip_or_fail(f"Slurm not installed ({', '.join(missing)} missing): "
                      "run scripts/slurm-local.sh install")
    try:
        started = _script("start", START_TIMEOUT_S)
        ok, why = started.returncode == 0, started.stderr.strip()[-1500:]
    except subprocess.TimeoutExpired:
        ok, why = False, f"no idle nodes within {START_TIMEOUT_S} s"
    if not ok:
        _script("stop", STOP_TIMEOUT_S)
        _skip_or_fail(f"scripts/slurm-local.sh start failed: {why}")
    conf = _script("env", 10).stdout.strip().split("=", 1)[1]
    state = Path(conf).parents[1]
    pids = {f.stem: int(f.read_text()) for f in (state / "pids").glob("*.pid")}
    assert {"munged", "slurmctld", "slurmd.n1", "slurmd.n2"} <= set(pids), pids
    env = {**os.environ, "SLURM_CONF": conf, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    try:
        yield env
    finally:
        stopped = _script("stop", STOP_TIMEOUT_S)
        assert stopped.returncode == 0, stopped.stderr
        alive = {name: pid for name, pid in pids.items() if _running(pid)}
        assert not alive, f"still running after stop: {alive}"
        assert not state.exists()


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_job(job_id: str, env: dict, limit_s: float) -> str:
    """Final state of a Slurm job (squeue; MinJobAge keeps finished jobs listed)."""
    end = time.monotonic() + limit_s
    state = ""
    while time.monotonic() < end:
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"],
                               capture_output=True, text=True, env=env, timeout=30).stdout.strip()
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                     "OUT_OF_MEMORY", "BOOT_FAIL"):
            return state
        time.sleep(1)
    subprocess.run(["scancel", job_id], env=env, timeout=30)
    return f"still {state or 'unknown'} after {limit_s} s (cancelled)"


# The probe's point: a GPU point on the fake GPUs (the probe itself only uses gloo), 2 nodes
# x 2 processes. Shared by the driver (inside the Slurm job) and the rendering test below.
PROBE_POINT = """
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
point = Point.for_layout(Model(), dp=4, device="cuda", devices_per_node=2, timeout_s=200,
                         site={"gpus_per_node": 2, "cpus_per_proc": 1}, point_id="probe-2x2")
"""

DRIVER = """
import os, subprocess, sys
from scalestudy.run import launch
""" + PROBE_POINT + """
# what Snakemake's jobstep wrapper leaves of SLURM_* in a rule's shell
env = {k: v for k, v in os.environ.items()
       if not k.startswith("SLURM_") or k in ("SLURM_JOB_ID", "SLURM_JOBID")}
argv = launch.launch_argv(point, sys.argv[1], environ=env, module="ss_probe")
print(" ".join(argv), flush=True)
sys.exit(subprocess.run(["timeout", "200", *argv], env=launch.launch_env(point, env)).returncode)
"""


def _probe_point():
    scope: dict = {}
    exec(PROBE_POINT, scope)
    return scope["point"]


def test_probe_point_renders_without_slurm(tmp_path):
    """What the Slurm tests rely on, checked without Slurm: the probe point's srun line (the
    job log's first line) and resources, and the CI study's 2 x 2 point."""
    from scalestudy.config.study import validate
    from scalestudy.plan.planner import plan_points
    from scalestudy.run import slurm

    point = _probe_point()
    assert (point.nodes, point.procs_per_node) == (2, 2)
    argv = launch.launch_argv(point, tmp_path, python="py", environ={"SLURM_JOB_ID": "77"},
                              module="ss_probe")
    line = " ".join(argv)
    assert line.startswith("srun --nodes 2 --ntasks 2 --ntasks-per-node 1"), line
    assert "--gres=gpu:2" in argv and "--cpus-per-task" in argv
    assert argv[argv.index("--cpus-per-task") + 1] == "2"  # 2 processes x cpus_per_proc 1
    assert argv[-4:] == ["-m", "ss_probe", str(tmp_path / "point.json"), str(tmp_path)]
    env = launch.env_additions(point, {"SLURM_JOB_ID": "77"})
    assert env == {"OMP_NUM_THREADS": "1"}  # GPU point: no GLOO_SOCKET_IFNAME
    res = slurm.point_resources(point)
    assert res["nodes"] == 2 and res["tasks"] == 2 and res["gres"] == "gpu:2"
    assert res["mpi"] == "srun" and res["runtime"] == 4 + slurm.DEFAULT_RUNTIME_MARGIN_MIN

    points = plan_points(validate(STUDY))
    assert [(p.n, p.nodes, p.procs_per_node, p.feasible) for p in points] == [
        (1, 1, 1, True), (4, 2, 2, True)]
    site = yaml.safe_load((CI_PROFILE / "site.yaml").read_text())["site"]
    multi = slurm.point_resources(points[1].replace(
        platform=replace(points[1].platform, site=points[1].platform.site.merged(site))))
    assert multi["nodes"] == 2 and multi["tasks"] == 2 and multi["mpi"] == "srun"


@pytest.mark.slurm
@pytest.mark.timeout(1500)
def test_sbatch_two_nodes_two_procs_all_reduce(slurm, tmp_path):
    from test_launch import check_probe, write_probe

    write_probe(tmp_path)
    (tmp_path / "driver.py").write_text(DRIVER)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**slurm, "PYTHONPATH": os.pathsep.join([str(tmp_path), slurm["PYTHONPATH"]])}
    log = tmp_path / "job.log"
    sub = subprocess.run(
        ["sbatch", "--parsable", "--nodes", "2", "--ntasks", "2", "--cpus-per-task", "2",
         "--gres=gpu:2", "--mem", "2500", "-t", "5", "-o", str(log), "-J", "ss-probe",
         "--wrap", f"{sys.executable} {tmp_path / 'driver.py'} {run_dir}"],
        capture_output=True, text=True, env=env, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    state = _wait_job(job_id, env, 300)
    text = log.read_text() if log.exists() else "(no log)"
    assert state == "COMPLETED", text[-3000:]
    assert text.startswith("srun --nodes 2 --ntasks 2 --ntasks-per-node 1"), text[:500]
    assert "--gres=gpu:2" in text.splitlines()[0]
    recs = check_probe(run_dir, nodes=2, procs=2)
    assert {r["job"] for r in recs} == {job_id}
    assert sorted(r["node"] for r in recs) == ["n1", "n1", "n2", "n2"]  # 2 ranks per node
    assert {r["gpus"] for r in recs} == {"0,1"}  # each rank sees its node's two GPUs


def _snakemake(study: Path, results: Path, profile: Path, env: dict,
               targets: tuple[str, ...] = ()) -> subprocess.Popen:
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(results), "--profile", str(profile), *targets,
            "--config", f"study={study}", f"results={results}"]
    results.mkdir(parents=True, exist_ok=True)
    log = open(results / "snakemake.out", "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, results: Path, deadline: float) -> tuple[int, str, float]:
    """Wait for a snakemake run until ``deadline`` (monotonic); (exit code, log, seconds)."""
    try:
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)  # snakemake cancels its Slurm jobs on SIGTERM
        proc.wait(timeout=60)
        rc = None
    text = (results / "snakemake.out").read_text(errors="replace")
    if rc is None:
        pytest.fail(f"snakemake in {results.name} ran past its deadline:\n{text[-3000:]}")
    return rc, text, time.monotonic() - proc.t0


def _outcome(out: Path) -> dict:
    plan = [ln.split("\t") for ln in (out / "plan.tsv").read_text().splitlines()]
    ids = [dict(zip(plan[0], row))["point_id"] for row in plan[1:]]
    return {pid: json.loads((out / "runs" / pid / "status.json").read_text())["state"]
            for pid in ids}


@pytest.mark.slurm
@pytest.mark.timeout(1500)
def test_study_through_slurm_gives_the_local_points_and_tables(slurm, tmp_path):
    """Through Slurm, the points a local run plans (ids hash the resolved config: same ids,
    same points), every one ``ok``, and the tables a local run writes (same columns, a row
    per point, every curve drawn)."""
    import pandas as pd

    from scalestudy.analysis.aggregate import RUN_COLUMNS
    from scalestudy.config.study import validate
    from scalestudy.plan.planner import plan_points

    study = tmp_path / "slurmci.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    proc = _snakemake(study, tmp_path / "slurm", CI_PROFILE, slurm)
    proc.t0 = time.monotonic()
    try:
        rc, log, seconds = _finish(proc, tmp_path / "slurm", time.monotonic() + 1000)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
    assert rc == 0, log[-4000:]
    assert "has been submitted with SLURM jobid" in log  # really went through Slurm
    print(f"slurm-ci run {seconds:.0f} s")

    out = tmp_path / "slurm" / "slurmci"
    state = _outcome(out)
    planned = [p.point_id for p in plan_points(validate(STUDY)) if p.feasible]
    assert sorted(state) == sorted(planned)  # the points a local run plans
    assert set(state.values()) == {"ok"}

    # the 2 x 2 point really ran as one srun task per node, 2 ranks each
    multi = [pid for pid in state if json.loads(
        (out / "runs" / pid / "point.json").read_text())["nodes"] == 2]
    assert len(multi) == 1
    env = json.loads((out / "runs" / multi[0] / "env.json").read_text())
    assert env["world_size"] == 4
    views = [r["env"] for r in env["ranks"]]
    assert {v["SLURM_JOB_NODELIST"] for v in views} == {"n[1-2]"}
    assert {v["SLURM_NNODES"] for v in views} == {"2"}
    assert sorted(v["SLURM_NODEID"] for v in views) == ["0", "0", "1", "1"]
    assert len({v["SLURM_JOB_ID"] for v in views}) == 1

    runs = pd.read_csv(out / "runs.csv")
    assert list(runs.columns) == RUN_COLUMNS  # the table a local run writes
    assert sorted(runs["point_id"]) == sorted(planned) and (runs["status"] == "ok").all()
    assert runs.set_index("point_id").loc[multi[0], "nodes"] == 2
    eff = pd.read_csv(out / "efficiency.csv")
    assert eff[["series", "n"]].values.tolist() == [["weak", 1], ["weak", 4]]
    assert eff["efficiency"].notna().all()
    assert (eff.loc[eff["n"] == 1, "efficiency"] - 1).abs().max() < 1e-12
    assert (out / "summary.md").is_file() and (out / "figures").is_dir()


# A 2-node x 1-process point whose rank 1 reaches every step 300 ms late
# (tests/fault_injection.py's slow fault), run by the runner inside a 2-node job: the node
# check runs over the allocation before each attempt, the run is ok but flagged with rank 1's
# node, and
# its retry is spent (scalestudy.run.health; docs/failures.md "Stragglers and node health").
STRAGGLER_POINT = """
import sys
from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.identity import identify
from scalestudy.record.io import write_text
point = identify(Point.for_layout(
    Model(layers=1, hidden=16, heads=2, seq_len=8, vocab=32), dp=2, device="cpu",
    devices_per_node=1, max_nodes=2, steps=4, warmup_steps=1, timeout_s=200,
    collective_timeout_s=60, retries=1, site={"cpus_per_proc": 1}))
write_text(sys.argv[1] + "/point.json", point.json_text())
"""


@pytest.mark.slurm
@pytest.mark.timeout(600)
def test_a_slow_node_is_checked_flagged_and_retried_on_slurm(slurm, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    subprocess.run([sys.executable, "-c", STRAGGLER_POINT, str(run_dir)], check=True,
                   env=slurm, timeout=60)
    tests = REPO / "tests"
    env = {**slurm, "SCALESTUDY_STEP_HOOK": "fault_injection:make_hook",
           "SCALESTUDY_FAULT": "slow:rank=1:ms=300",
           "PYTHONPATH": os.pathsep.join([str(tests), slurm["PYTHONPATH"]])}
    log = tmp_path / "job.log"
    sub = subprocess.run(
        ["sbatch", "--parsable", "--nodes", "2", "--ntasks", "2", "--cpus-per-task", "1",
         "--mem", "2500", "-t", "5", "-o", str(log), "-J", "ss-straggler", "--wrap",
         f"{sys.executable} -m scalestudy run-point --job {run_dir / 'point.json'} {run_dir}"],
        capture_output=True, text=True, env=env, timeout=60)
    assert sub.returncode == 0, sub.stderr
    state = _wait_job(sub.stdout.strip().split(";")[0], env, 400)
    text = log.read_text() if log.exists() else "(no log)"
    assert state == "COMPLETED", text[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "ok", status
    assert len(status["attempts"]) == 2, status["attempts"]  # the retry was spent on the flag
    for a in status["attempts"]:
        assert sorted(r["node"] for r in a["node_check"]["rows"]) == ["n1", "n2"], a
        assert a["node_check"]["exclude"] == []  # no spare node in a 2-node allocation
        assert a["straggler"].startswith("straggler: rank 1 on n"), a
    # the rendezvous orders the nodes by arrival: rank 1 is on either node, named as Slurm does
    env = json.loads((run_dir / "env.json").read_text())
    (node,) = [r["env"]["SLURMD_NODENAME"] for r in env["ranks"] if r["rank"] == 1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stragglers"]["straggler_host"] == node
    assert status["attempts"][-1]["straggler"].startswith(f"straggler: rank 1 on {node} ")


TUNE_STUDY = {
    "name": "slurmtune",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 4, "warmup_steps": 1},
    "platform": {"device": "cpu", "devices_per_node": 2, "max_nodes": 2, "timeout_s": 400},
    "tune": {"model": "m", "gpus": 2, "global_batch": 4,
             "space": {"tp": [1, 2], "pp": [1], "micro_batch": [2], "dp_mode": ["ddp"],
                       "activation_checkpointing": ["none"]},
             "trials": 2, "parallel": 2, "warm_start": 0},
}


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_tune_searches_through_slurm(slurm, tmp_path):
    """``scalestudy tune --measure --profile slurm-ci``: the trials are Slurm jobs (a batch of
    up to 2), their records the search's, and a rerun submits nothing."""
    from scalestudy.record.trials import read_trials

    study = tmp_path / "tune.yaml"
    study.write_text(yaml.safe_dump(TUNE_STUDY))
    argv = [sys.executable, "-m", "scalestudy.cli", "tune", str(study), "--measure",
            "--results", str(tmp_path / "r"), "--profile", str(CI_PROFILE)]
    done = subprocess.run(argv, capture_output=True, text=True, env=slurm, timeout=800)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "has been submitted with SLURM jobid" in log  # the trials went through Slurm
    trials = read_trials(tmp_path / "r" / "slurmtune" / "tune" / "trials.csv")
    ran = trials[trials["state"] == "complete"]
    assert sorted(ran["layout"]) == ["tp1-pp1-mb2-ddp-acnone", "tp2-pp1-mb2-ddp-acnone"]
    assert (~ran["reused"]).all()
    assert set(trials["state"]) <= {"complete", "duplicate", "refused"}
    again = subprocess.run(argv, capture_output=True, text=True, env=slurm, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "submitted with SLURM jobid" not in again.stdout + again.stderr


DOWN_STUDY = {
    "name": "slurmdown",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "train": {"steps": 30, "warmup_steps": 1},
    # a job on a node that goes DOWN fails (NODE_FAIL) instead of waiting to be requeued
    "platform": {"device": "cpu", "devices_per_node": 2, "timeout_s": 400,
                 "site": {"extra": "--no-requeue"}},
    "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [2], "micro_batch": 1}],
}
TOKEN_ENV = "SCALESTUDY_TEST_SWEEP"
# Once a job's step daemons (slurmstepd) are gone, Slurm has ended it: every process it tracks
# was killed. A process killed last (by its parent's death signal) may still be exiting then;
# one alive this long after is not exiting, it is left behind (the stray this test was written
# for lived until it was killed by hand, minutes later). 2 x the test Slurm's KillWait (5 s).
SETTLE_S = 10


def _swept(token: str) -> dict[int, str]:
    """The live processes (not zombies) whose environment holds the sweep's token: pid ->
    "parent pid, age, command line"."""
    found = {}
    needle = f"{TOKEN_ENV}={token}".encode()
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle not in Path(f"/proc/{name}/environ").read_bytes().split(b"\0"):
                continue
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if stat[0] != "Z":
            age = uptime - int(stat[19]) / os.sysconf("SC_CLK_TCK")
            found[int(name)] = (f"parent {stat[1]}, up {age:.0f} s: "
                                f"{cmd.decode(errors='replace')[:200]}")
    return found


def _stepds(jobs: set[str]) -> list[int]:
    """The slurmstepd processes of these Slurm jobs (``slurmstepd: [JOB.STEP]``)."""
    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        if cmd.startswith(b"slurmstepd: [") and cmd[13:].split(b".")[0].decode() in jobs:
            out.append(int(name))
    return out


def _left_after(log: str, token: str) -> dict[int, str]:
    """The sweep's processes left once Slurm has ended the jobs Snakemake submitted (their
    step daemons gone, bounded) and :data:`SETTLE_S` has passed for what is still exiting."""
    jobs = set(re.findall(r"with SLURM jobid (\d+)", log))
    assert jobs, log[-3000:]
    deadline = time.monotonic() + 120
    while _stepds(jobs):
        assert time.monotonic() < deadline, f"slurmstepd of jobs {jobs} still running"
        time.sleep(0.5)
    deadline = time.monotonic() + SETTLE_S
    while _swept(token) and time.monotonic() < deadline:
        time.sleep(0.5)
    return _swept(token)


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_a_node_down_mid_point_leaves_no_process_and_the_rerun_finishes(slurm, tmp_path):
    """A point's node set DOWN while it trains (``scontrol update state=down``; it stays DOWN):
    the sweep ends with the point unfinished, and once Slurm has ended its job no process of
    it (Snakemake's job steps, the runner, torchrun, a rank) is left; the rerun trains it on
    the other node, ok, and leaves none either. Holds under either process tracking
    (``SLURM_LOCAL_PROCTRACK``): by cgroup, and by parent pid, where a cluster job's Snakemake
    dies with its parent (``lifetime.as_cluster_job``; docs/slurm.md, "Process tracking")."""
    import uuid

    study = tmp_path / "down.yaml"
    study.write_text(yaml.safe_dump(DOWN_STUDY))
    token = uuid.uuid4().hex
    tests = REPO / "tests"
    slow = {**slurm, TOKEN_ENV: token, "SCALESTUDY_STEP_HOOK": "fault_injection:make_hook",
            "SCALESTUDY_FAULT": "slow:rank=0:ms=500",  # ~15 s of training to cut into
            "PYTHONPATH": os.pathsep.join([str(tests), slurm["PYTHONPATH"]])}
    results = tmp_path / "r"
    out = results / "slurmdown"
    from scalestudy.config.study import validate
    from scalestudy.plan.planner import plan_points

    (point,) = [p for p in plan_points(validate(DOWN_STUDY)) if p.feasible]
    # the point's record alone (no calibration, tables or plots: they are not what is tested)
    target = (str(out / "runs" / point.point_id / "status.json"),)
    proc = _snakemake(study, results, CI_PROFILE, slow, target)
    proc.t0 = time.monotonic()
    node = None
    try:
        deadline = time.monotonic() + 400
        while node is None:
            assert proc.poll() is None and time.monotonic() < deadline, \
                (results / "snakemake.out").read_text()[-3000:]
            logs = list(out.glob("runs/*/stdout.log"))
            if logs and "slow by" in logs[0].read_text(errors="replace"):
                node = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%N"], env=slurm,
                                      capture_output=True, text=True, timeout=30).stdout.split()
                node = next((n for n in node if n.startswith("n")), None)
            time.sleep(0.5)
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down",
                        "reason=scalestudy-test"], env=slurm, check=True, timeout=30)
        rc, log, _ = _finish(proc, results, time.monotonic() + 400)
        assert not (out / "runs" / point.point_id / "status.json").exists(), log[-3000:]
        left = _left_after(log, token)
        assert not left, f"alive after the sweep ended ({node} DOWN): {left}"

        rerun = _snakemake(study, results, CI_PROFILE, {**slurm, TOKEN_ENV: token}, target)
        rerun.t0 = time.monotonic()
        rc, log, _ = _finish(rerun, results, time.monotonic() + 500)
        assert rc == 0, log[-4000:]
        run_dir = out / "runs" / point.point_id
        assert json.loads((run_dir / "status.json").read_text())["state"] == "ok"
        ranks = json.loads((run_dir / "env.json").read_text())["ranks"]
        assert {r["env"]["SLURMD_NODENAME"] for r in ranks} == {"n1", "n2"} - {node}
        left = _left_after(log, token)
        assert not left, f"alive after the rerun ended: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=30)
        subprocess.run(["scontrol", "update", f"nodename={node or 'n1'}", "state=resume"],
                       env=slurm, timeout=30)
        for pid in _swept(token):  # what a failure left: this test's processes only
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
