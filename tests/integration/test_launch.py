"""The launch lines of a point: torchrun (one node), srun + torchrun (several nodes), and the
sbatch line Snakemake's Slurm plugin builds from ``slurm.point_resources`` /
``slurm.job_resources``. Pure: nothing is started (but for one real two-node launch)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Platform
from scalestudy.config.site import Site
from scalestudy.run import launch, nodes, slurm
from scalestudy import cli


def make_point(nodes=1, procs=2, device="cpu", timeout_s=600, pid="weak-dp_n4_x_r0",
               **options) -> Point:
    """A point on ``nodes`` nodes of ``procs`` processes each (``devices_per_node`` = procs).
    ``options``: further fields of the point or its parts (``site=...``)."""
    return Point.for_layout(Model(), dp=nodes * procs, device=device, devices_per_node=procs,
                            timeout_s=timeout_s, collective_timeout_s=120, point_id=pid,
                            **options)


def test_make_point_has_the_asked_shape():
    p = make_point(3, 4, "cuda")
    assert (p.nodes, p.procs_per_node, p.n) == (3, 4, 12)
    assert p.platform.device == "cuda" and p.point_id == "weak-dp_n4_x_r0"


def flag(argv, name):
    """Value after ``name`` in argv (``--x v`` or ``--x=v``)."""
    for i, a in enumerate(argv):
        if a == name:
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{name} not in {argv}")


RUN = Path("/r/runs/p")


def test_single_node_is_torchrun_on_loopback():
    argv = launch.launch_argv(make_point(1, 4), RUN, python="/venv/bin/python", environ={})
    assert argv[:5] == ["/venv/bin/python", "-m", "scalestudy", "torchrun", "--"]
    assert flag(argv, "--nnodes") == "1"
    assert flag(argv, "--nproc-per-node") == "4"
    assert flag(argv, "--rdzv-backend") == "c10d"
    host, port = flag(argv, "--rdzv-endpoint").rsplit(":", 1)
    assert host == "127.0.0.1" and port == "0"  # kernel-chosen free port at bind time
    assert flag(argv, "--rdzv-id") == "weak-dp_n4_x_r0"
    assert flag(argv, "--local-addr") == "127.0.0.1"
    assert argv[-4:] == ["-m", "scalestudy.train", str(RUN / "point.json"), str(RUN)]
    assert "srun" not in argv


def test_single_node_inside_slurm_is_unchanged():
    env = {"SLURM_JOB_ID": "42"}
    assert launch.launch_argv(make_point(1, 2), RUN, environ=env) == \
        launch.launch_argv(make_point(1, 2), RUN, environ={})


def test_multi_node_is_one_srun_task_per_node():
    site = {"cpus_per_proc": 3}
    argv = launch.launch_argv(make_point(2, 2, site=site), RUN, python="py",
                              environ={"SLURM_JOB_ID": "1234"})
    assert argv[0] == "srun"
    assert flag(argv, "--nodes") == "2"
    assert flag(argv, "--ntasks") == "2"
    assert flag(argv, "--ntasks-per-node") == "1"
    assert flag(argv, "--cpus-per-task") == "6"
    assert "--kill-on-bad-exit=1" in argv
    assert not any(a.startswith("--gres") for a in argv)  # CPU point
    i = argv.index("py")
    assert argv[i:i + 5] == ["py", "-m", "scalestudy", "nodes", "node"]
    node = argv[i + 5:]
    assert flag(node, "--nnodes") == "2" and flag(node, "--nproc-per-node") == "2"
    assert flag(node, "--rdzv-id") == "1234-weak-dp_n4_x_r0"
    assert "--port" not in node  # the first node picks a free one at job start
    assert flag(node, "--rdzv-dir") == str(RUN)  # ... and tells the others there
    assert node[node.index("--"):] == ["--", "-m", "scalestudy.train", str(RUN / "point.json"),
                                       str(RUN)]


def test_multi_node_gpu_requests_gpus_per_node():
    argv = launch.launch_argv(make_point(4, 8, "cuda", site={"gpus_per_node": 8, "cpus_per_node": 64,
                                                             "rdzv_port": 6000}),
                              RUN, environ={"SLURM_JOB_ID": "7"})
    assert flag(argv, "--gres") == "gpu:8"
    assert flag(argv, "--cpus-per-task") == "64"
    assert flag(argv, "--port") == "6000"
    fr = launch.launch_argv(make_point(2, 8, "cuda", site={"gpu_request": "gpus-per-node",
                                                           "srun_extra": "--gpu-bind=closest"}),
                            RUN, environ={"SLURM_JOB_ID": "7"})
    assert flag(fr, "--gpus-per-node") == "8"
    assert "--gpu-bind=closest" in fr and not any(a.startswith("--gres") for a in fr)


def test_multi_node_outside_slurm_emulates_nodes_on_this_host():
    argv = launch.launch_argv(make_point(2, 2), RUN, python="py", environ={})
    assert argv[:5] == ["py", "-m", "scalestudy", "nodes", "local-nodes"]
    assert flag(argv, "--nnodes") == "2" and flag(argv, "--nproc-per-node") == "2"
    assert argv[argv.index("--"):] == ["--", "-m", "scalestudy.train", str(RUN / "point.json"),
                                       str(RUN)]
    argvs = nodes.local_nodes_argvs(nnodes=2, nproc_per_node=2, rdzv_id="p", port=5000,
                                    train=["-m", "m"], python="py")
    assert len(argvs) == 2
    for i, a in enumerate(argvs):
        assert flag(a, "--rdzv-endpoint") == "127.0.0.1:5000" and flag(a, "--nnodes") == "2"
        assert flag(a, "--rdzv-conf") == f"is_host={int(i == 0)}"
        assert flag(a, "--local-addr") == "127.0.0.1" and a[-2:] == ["-m", "m"]
    env = launch.env_additions(make_point(2, 2), {"SLURM_CPUS_PER_TASK": "8"})
    assert env == {"OMP_NUM_THREADS": "2", "GLOO_SOCKET_IFNAME": "lo",  # 8 cores / 4 procs
                   "NCCL_SOCKET_IFNAME": "lo"}


def test_node_argv_first_node_hosts_the_rendezvous(monkeypatch):
    monkeypatch.setattr(nodes, "expand_nodelist", lambda nl: {"n[1-2]": ["n1", "n2"]}[nl])
    monkeypatch.setattr(nodes, "node_addr", lambda n: "127.0.0.1")
    train = ["-m", "scalestudy.train", "pj", "rd"]
    common = dict(nnodes=2, nproc_per_node=2, rdzv_id="9-p", port=29509, train=train, python="py")
    a1, e1 = nodes.node_argv(environ={"SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1"},
                              **common)
    a2, e2 = nodes.node_argv(environ={"SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2"},
                              **common)
    for a in (a1, a2):
        assert a[:5] == ["py", "-m", "scalestudy", "torchrun", "--"]
        assert flag(a, "--nnodes") == "2" and flag(a, "--nproc-per-node") == "2"
        assert flag(a, "--rdzv-backend") == "c10d"
        assert flag(a, "--rdzv-endpoint") == "127.0.0.1:29509"
        assert flag(a, "--rdzv-id") == "9-p"
        assert flag(a, "--local-addr") == "127.0.0.1"  # emulated nodes reach each other on lo
        assert a[-4:] == train
    assert flag(a1, "--rdzv-conf") == "is_host=1" and flag(a2, "--rdzv-conf") == "is_host=0"
    assert e1 == e2 == {"GLOO_SOCKET_IFNAME": "lo"}


def test_node_argv_real_cluster_uses_node_names(monkeypatch):
    monkeypatch.setattr(nodes, "expand_nodelist", lambda nl: ["frontier00001", "frontier00002"])
    monkeypatch.setattr(nodes, "node_addr", lambda n: n)
    a, env = nodes.node_argv(nnodes=2, nproc_per_node=8, rdzv_id="1-p", port=29501,
                              train=["x"], python="py",
                              environ={"SLURM_JOB_NODELIST": "frontier[00001-00002]",
                                       "SLURMD_NODENAME": "frontier00002"})
    assert flag(a, "--rdzv-endpoint") == "frontier00001:29501"
    assert flag(a, "--local-addr") == "frontier00002" and env == {}  # the workers' store there


def test_node_argv_needs_a_nodelist():
    with pytest.raises(RuntimeError, match="SLURM_JOB_NODELIST"):
        nodes.node_argv(nnodes=2, nproc_per_node=1, rdzv_id="x", port=1, train=[], environ={})


# --- resources and the sbatch line ----------------------------------------------------------

def test_resources_cpu_single_node():
    r = slurm.point_resources(make_point(1, 2, timeout_s=600, site={"partition": "debug"}))
    assert r["nodes"] == 1 and r["tasks"] == 1 and r["cpus_per_task"] == 2
    assert r["runtime"] == 10 + slurm.DEFAULT_RUNTIME_MARGIN_MIN
    assert r["mem_mb"] == 2 * slurm.DEFAULT_CPU_MEM_PER_PROC_MB + 512
    assert r["slurm_partition"] == "debug"
    assert "mpi" not in r and "gres" not in r and "slurm_account" not in r


def test_resources_gpu_multi_node():
    site = {"partition": "gpu", "account": "abc123", "constraint": "h100", "gpus_per_node": 4,
            "cpus_per_node": 32, "mem_per_node_mb": 400000, "exclusive": True,
            "extra": "--signal=USR1@60"}
    r = slurm.point_resources(make_point(3, 4, "cuda", timeout_s=3600, site=site))
    assert r == {"nodes": 3, "tasks": 3, "cpus_per_task": 32, "mem_mb": 400000, "runtime": 65,
                 "tasks_per_gpu": 0, "gres": "gpu:4", "mpi": "srun", "slurm_partition": "gpu",
                 "slurm_account": "abc123", "constraint": "h100",
                 "slurm_extra": "--exclusive --signal=USR1@60"}
    half = slurm.point_resources(make_point(1, 2, "cuda", site=site))
    assert half["mem_mb"] == 200000 and half["cpus_per_task"] == 16 and half["gres"] == "gpu:2"


def test_resources_reject_more_procs_than_gpus():
    with pytest.raises(ValueError, match="gpus_per_node"):
        slurm.point_resources(make_point(1, 8, "cuda", site={"gpus_per_node": 4}))


class _Res(dict):
    __getattr__ = dict.__getitem__


class _Job:
    def __init__(self, resources, threads=1):
        self.resources, self.threads = _Res(resources), threads


def sbatch_line(resources):
    """The sbatch line snakemake-executor-plugin-slurm builds for these resources."""
    sub = pytest.importorskip("snakemake_executor_plugin_slurm.submit_string")
    utils = pytest.importorskip("snakemake_executor_plugin_slurm.utils")
    job = _Job(resources)
    part = f"-p {resources['slurm_partition']}" if resources.get("slurm_partition") else ""
    acct = f"-A {resources['slurm_account']}" if resources.get("slurm_account") else ""
    call = sub.get_submit_command(job, {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c",
                                        "account": acct, "partition": part, "workdir": "/w"})
    return shlex.split(call + utils.set_gres_string(job))


def test_sbatch_line_multi_node_gpu():
    site = {"partition": "gpu", "gpus_per_node": 4, "cpus_per_node": 32}
    argv = sbatch_line(slurm.point_resources(make_point(2, 4, "cuda", timeout_s=1800, site=site)))
    assert flag(argv, "--nodes") == "2"
    assert flag(argv, "--ntasks") == "2"  # one torchrun launcher per node
    assert flag(argv, "--cpus-per-task") == "32"
    assert flag(argv, "--gres") == "gpu:4"  # per node, not a per-job total
    assert flag(argv, "-t") == "35" and flag(argv, "-p") == "gpu"
    assert not any(a.startswith(("--ntasks-per-gpu", "--gpus=")) for a in argv)


def test_sbatch_line_single_node_cpu_and_frontier():
    argv = sbatch_line(slurm.point_resources(make_point(1, 2, site={"partition": "debug"})))
    assert flag(argv, "--nodes") == "1" and flag(argv, "--ntasks") == "1"
    assert flag(argv, "--cpus-per-task") == "2"
    assert flag(argv, "--mem") == str(2 * slurm.DEFAULT_CPU_MEM_PER_PROC_MB + 512)
    fr = {"partition": "batch", "account": "abc123", "gpus_per_node": 8, "cpus_per_node": 56,
          "gpu_request": "gpus-per-node", "exclusive": True}
    argv = sbatch_line(slurm.point_resources(make_point(16, 8, "cuda", timeout_s=1200, site=fr)))
    assert flag(argv, "--nodes") == "16" and flag(argv, "--ntasks") == "16"
    assert flag(argv, "--gpus-per-node") == "8" and "--exclusive" in argv
    assert flag(argv, "--cpus-per-task") == "56" and flag(argv, "-A") == "abc123"
    assert "--mem" not in argv  # GPU site without a memory figure: the cluster default


# --- environment ----------------------------------------------------------------------------

def test_launch_env_keeps_the_callers_environment():
    environ = {"PATH": "/usr/bin", "SLURM_JOB_ID": "3", "PYTHONPATH": "/src"}
    env = launch.launch_env(make_point(2, 2, site={"cpus_per_proc": 2}), environ)
    assert env == {**environ, "OMP_NUM_THREADS": "2"}  # srun needs SLURM_JOB_ID


def test_launch_env_threads_and_gloo_interface():
    env = launch.env_additions(make_point(1, 2), {"SLURM_CPUS_PER_TASK": "2"})
    assert env == {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    env = launch.env_additions(make_point(1, 1), {"SLURM_CPUS_PER_TASK": "4"})
    assert env["OMP_NUM_THREADS"] == "4"
    assert launch.env_additions(make_point(1, 2), {"OMP_NUM_THREADS": "1",
                                                "GLOO_SOCKET_IFNAME": "eth0"}) == {
        "NCCL_SOCKET_IFNAME": "lo"}  # the caller's wins
    # a point on one host talks over loopback whatever the site says (its interfaces are for
    # the cluster's network between nodes)
    env = launch.env_additions(make_point(1, 2, "cuda", site={
        "env": {"NCCL_SOCKET_IFNAME": "hsn0", "NCCL_DEBUG": "WARN"}}), {})
    assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_DEBUG"] == "WARN"


def test_a_process_gets_one_devices_share_of_the_host_at_every_n():
    """Outside Slurm a host of ``devices_per_node`` devices gives each process the same share
    of its cores whatever the point's N (a 1-process point on a 2-core host of 8 devices: 1
    thread, as its 4-process point's and the calibration's); more processes than devices
    share the host; under Slurm the allocation is sized per process already."""
    two_cores = {"SLURM_CPUS_PER_TASK": "2"}
    for procs in (1, 2, 4, 8):
        p = Point.for_layout(Model(), dp=procs, device="cpu", devices_per_node=8)
        assert launch.env_additions(p, two_cores)["OMP_NUM_THREADS"] == "1"
    assert launch.threads_per_process(1, 8, {"SLURM_CPUS_PER_TASK": "16"}) == 2
    assert launch.threads_per_process(16, 8, {"SLURM_CPUS_PER_TASK": "16"}) == 1
    assert launch.threads_per_process(2, 8, {"SLURM_CPUS_PER_TASK": "8", "SLURM_JOB_ID": "3"}) == 4


def test_the_calibration_times_one_devices_share_of_the_host(tmp_path, monkeypatch):
    """Without ``--threads`` the calibration runs with the threads one point's process gets:
    ``OMP_NUM_THREADS`` when set, else ``threads_per_process`` (4 cores, 2 devices: 2)."""
    import torch

    from scalestudy.record.io import read_json

    out, before = tmp_path / "calibration.json", torch.get_num_threads()
    args = ["--device", "cpu", "--out", str(out), "--size", "32", "--samples", "1",
            "--max-seconds", "0.2", "--devices-per-node", "2"]
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv("SLURM_JOB_ID", raising=False)
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
        assert cli.main(["calibrate", *args]) == 0 and read_json(out)["threads"] == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert cli.main(["calibrate", *args]) == 0 and read_json(out)["threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_launch_env_gpu_site_env_wins():
    site = {"gpus_per_node": 8, "cpus_per_node": 56,
            "env": {"NCCL_NET_GDR_LEVEL": "3", "OMP_NUM_THREADS": "2"}}
    job = {"SLURM_JOB_ID": "1"}
    env = launch.env_additions(make_point(2, 8, "cuda", site=site), job)
    assert env == {"NCCL_NET_GDR_LEVEL": "3", "OMP_NUM_THREADS": "2"}
    env = launch.env_additions(make_point(2, 8, "cuda", site={**site, "env": {}}), job)
    assert env == {"OMP_NUM_THREADS": "7"}  # 56 cores / 8 GCDs, no GLOO_SOCKET_IFNAME on GPU


def test_rule_resources_drop_absent_keys():
    res = slurm.rule_resources(lambda w: slurm.point_resources(make_point(int(w), 2)))
    assert set(res) == set(slurm.RESOURCE_KEYS)
    assert res["mpi"]("1") is None and res["mpi"]("2") == "srun"
    assert res["nodes"]("2") == 2 and res["gres"]("2") is None


def test_job_resources_of_a_job_that_is_not_a_point():
    # e.g. the calibrate job: one process on one device of a node, under the study's platform
    site = {"partition": "gpu", "gpus_per_node": 4, "cpus_per_node": 32}
    plat = Platform(device="cuda", devices_per_node=4, timeout_s=900, site=site)
    r = slurm.job_resources(1, 1, plat, label="calibrate")
    assert r == {"nodes": 1, "tasks": 1, "cpus_per_task": 8, "mem_mb": 0, "runtime": 20,
                 "tasks_per_gpu": 0, "gres": "gpu:1", "slurm_partition": "gpu"}
    with pytest.raises(ValueError, match="calibrate: procs_per_node=8 exceeds"):
        slurm.job_resources(1, 8, plat, label="calibrate")
    with pytest.raises(ValueError, match="calibrate: nodes=0"):
        slurm.job_resources(0, 1, plat, label="calibrate")
    # a point's resources are the same function of its shape and platform
    p = make_point(2, 4, "cuda", timeout_s=900, site=site)
    assert slurm.point_resources(p) == slurm.job_resources(2, 4, p.platform)
    res = slurm.rule_resources(lambda w: slurm.job_resources(1, 1, plat))
    assert res["mpi"](None) is None and res["gres"](None) == "gpu:1"


# --- a real launch (torchrun start-up dominates: ~10-40 s on 2 shared cores) ---------------

PROBE = '''
import json, os, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
rec = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
       "local_world": int(os.environ["LOCAL_WORLD_SIZE"]),
       "group_rank": int(os.environ["GROUP_RANK"]),
       "omp": os.environ.get("OMP_NUM_THREADS"), "job": os.environ.get("SLURM_JOB_ID"),
       "node": os.environ.get("SLURMD_NODENAME"),
       "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}
with open(os.path.join(sys.argv[2], f"rank{rec['rank']}.json"), "w") as f:
    json.dump(rec, f)
dist.barrier()
dist.destroy_process_group()
'''


def write_probe(directory: Path) -> str:
    """A tiny all-reduce entry point (``python -m ss_probe POINT_JSON RUN_DIR``)."""
    (directory / "ss_probe.py").write_text(PROBE)
    return "ss_probe"


def check_probe(run_dir: Path, nodes: int, procs: int) -> list[dict]:
    import json
    world = nodes * procs
    recs = sorted((json.loads(f.read_text()) for f in run_dir.glob("rank*.json")),
                  key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == list(range(world))
    assert all(r["world"] == world and r["sum"] == world * (world + 1) / 2 for r in recs)
    assert all(r["local_world"] == procs for r in recs)
    assert sorted({r["group_rank"] for r in recs}) == list(range(nodes))
    return recs


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_two_emulated_nodes_all_reduce(tmp_path):
    import os
    import subprocess
    module = write_probe(tmp_path)
    point = make_point(2, 2, pid="probe-2x2")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    argv = launch.launch_argv(point, run_dir, environ=environ, module=module)
    env = {**launch.launch_env(point, environ),
           "PYTHONPATH": os.pathsep.join([str(tmp_path),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(["timeout", "200", *argv], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_probe(run_dir, 2, 2)


@pytest.mark.parametrize("profile", ["slurm", "frontier", "slurm-ci"])
def test_profile_site_files(repo, profile):
    """Each shipped profile's site.yaml resolves and yields a valid sbatch line."""
    import yaml
    site = Site.resolve(yaml.safe_load(
        (repo / "workflow" / "profiles" / profile / "site.yaml").read_text())["site"])
    gpu = profile != "slurm-ci"
    procs = site.gpus_per_node if gpu else 2
    point = make_point(2, procs, "cuda" if gpu else "cpu", timeout_s=900, site=site)
    argv = sbatch_line(slurm.point_resources(point))
    assert flag(argv, "--nodes") == "2" and flag(argv, "--ntasks") == "2"
    assert flag(argv, "-p") == site.partition
    if gpu:
        per_node = flag(argv, "--gres") if site.gpu_request == "gres" else \
            "gpu:" + flag(argv, "--gpus-per-node")
        assert per_node == f"gpu:{procs}"
        assert flag(argv, "--cpus-per-task") == str(site.cpus_per_node)
        assert "--exclusive" in argv
    if profile == "frontier":
        assert site.gpus_per_node == 8 and site.env["NCCL_NET_GDR_LEVEL"] == "3"
        assert flag(argv, "--gpus-per-node") == "8"
