"""The command lines that start a point: torchrun on one node, ``srun`` + torchrun on several.

- One node (``point["nodes"] == 1``): ``python -m torch.distributed.run --nnodes 1
  --nproc-per-node P`` with a c10d rendezvous on ``127.0.0.1:0`` (the rendezvous store binds a
  free port chosen by the kernel at bind time, so concurrent points never race for a port; this
  is what ``torchrun --standalone`` does, with the loopback address) and ``--local-addr
  127.0.0.1`` so the workers are told a loopback address too. (torch's TCPStore server itself
  listens on every interface, whatever the address it is given.)
- Several nodes inside a Slurm allocation (``SLURM_JOB_ID`` set): ``srun --nodes K --ntasks K
  --ntasks-per-node 1 --cpus-per-task C --kill-on-bad-exit=1 python -m scalestudy.launch node``.
  Each srun task reads the allocation's node list *inside the task* (Snakemake's Slurm jobstep
  wrapper strips the ``SLURM_*`` layout variables from the rule's shell), takes the first node
  as the c10d rendezvous host and replaces itself with ``torchrun --nnodes K
  --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint <first node>:<port>
  --rdzv-id <SLURM_JOB_ID>-<point_id>``.
- Several nodes outside Slurm (a laptop, CI): ``python -m scalestudy.launch local-nodes`` starts
  K torchrun launchers on this host with the same multi-node c10d rendezvous over loopback
  (emulated nodes: same ranks and collectives, so the same point runs on a laptop and a
  cluster; only the network differs).
- :func:`job_resources` gives the Snakemake resources of a point's training job under the
  ``slurm`` executor plugin (sbatch flags), :func:`launch_env` the environment of the launch,
  :func:`slurm_env_record` what the ranks see of Slurm (for ``env.json``).

Site settings (partition, account, GPUs per node, NCCL/RCCL environment, ...) come from a
``site`` mapping, never from code: the study's ``platform.site`` merged with the profile's
``config: site:`` (:func:`resolve_site`) and stored in each point's ``platform.site`` (not part
of the config hash, so a point keeps its id on every machine). :data:`SITE_KEYS` lists the keys.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping

#: Keys of the ``site`` mapping (study ``platform.site`` / profile ``config: site:``).
SITE_KEYS: dict[str, str] = {
    "partition": "Slurm partition (sbatch -p); null: the cluster default",
    "account": "Slurm account (sbatch -A); null: the user's default",
    "qos": "Slurm QoS (sbatch --qos); null: none",
    "constraint": "node feature constraint (sbatch -C); null: none",
    "gpus_per_node": "accelerators per node; null: the point's platform.devices_per_node",
    "cpus_per_node": "usable cores per node; sets cores per process on GPU sites",
    "cpus_per_proc": "cores per training process; null: cpus_per_node // gpus_per_node "
    "(GPU) or 1 (CPU)",
    "mem_per_node_mb": "memory per node (MB); a point using P of G devices asks for P/G of it",
    "mem_per_proc_mb": "memory per training process (MB); wins over mem_per_node_mb",
    "gpu_request": "'gres' (--gres=gpu:P per node, default), 'gpus-per-node' "
    "(--gpus-per-node=P, e.g. Frontier) or 'none' (the nodes' GPUs come with the node)",
    "exclusive": "true: whole nodes per point (sbatch --exclusive), for timing isolation",
    "extra": "further sbatch flags, verbatim (e.g. '--gpu-bind=closest')",
    "srun_extra": "further flags for the multi-node srun, verbatim",
    "torchrun_extra": "further torchrun flags, verbatim (e.g. '--numa-binding=node')",
    "env": "environment of the ranks (mapping), e.g. NCCL/RCCL settings",
    "runtime_margin_min": "minutes added to platform.timeout_s for the Slurm time limit "
    "(default 5), so the runner's own watchdog fires first",
    "rdzv_port": "c10d rendezvous port on the first node of a multi-node point; "
    "null: 29500 + SLURM_JOB_ID mod 3000",
}

_INT_KEYS = ("gpus_per_node", "cpus_per_node", "cpus_per_proc", "mem_per_node_mb",
             "mem_per_proc_mb", "runtime_margin_min", "rdzv_port")
_GPU_REQUESTS = ("gres", "gpus-per-node", "none")
DEFAULT_CPU_MEM_PER_PROC_MB = 1024
DEFAULT_RUNTIME_MARGIN_MIN = 5


def resolve_site(*layers: Mapping | None) -> dict:
    """Merge site mappings (later layers win, except with null; ``env`` merges key by key) and
    coerce types.

    Snakemake passes profile ``config:`` values as strings (YAML BaseLoader), so numbers and
    booleans are converted here. Unknown keys raise: a typo must not silently do nothing."""
    site: dict = {}
    env: dict = {}
    for layer in layers:
        for key, value in (layer or {}).items():
            if key not in SITE_KEYS:
                raise ValueError(f"site: unknown key {key!r}; known keys: {', '.join(SITE_KEYS)}")
            if value is None:  # null: not set in this layer (an earlier layer's value stays)
                site.setdefault(key, None)
            elif key == "env":
                env.update({str(k): str(v) for k, v in (value or {}).items()})
            else:
                site[key] = value
    for key in _INT_KEYS:
        if site.get(key) in ("", "null", "None"):
            site[key] = None
        if site.get(key) is not None:
            try:
                site[key] = int(site[key])
            except (TypeError, ValueError):
                raise ValueError(f"site.{key}: expected an integer, got {site[key]!r}") from None
    for key in ("partition", "account", "qos", "constraint", "extra", "srun_extra",
                "torchrun_extra"):
        if site.get(key) in ("", "null", "None"):
            site[key] = None
    if isinstance(site.get("exclusive"), str):
        site["exclusive"] = site["exclusive"].strip().lower() in ("1", "true", "yes", "on")
    site.setdefault("gpu_request", "gres")
    if site["gpu_request"] not in _GPU_REQUESTS:
        raise ValueError(f"site.gpu_request: {site['gpu_request']!r}; use one of {_GPU_REQUESTS}")
    site["env"] = env
    return site


def _site(point: Mapping, site: Mapping | None) -> dict:
    """The given site, else the point's ``platform.site``, resolved."""
    if site is None:
        site = point.get("platform", {}).get("site") or {}
    return resolve_site(site)


def _is_gpu(point: Mapping, site: Mapping | None = None) -> bool:
    """GPU point: device cuda/rocm, or ``auto`` on a site that declares GPUs per node."""
    device = point.get("platform", {}).get("device", "cpu")
    if device == "auto":
        return bool((site or {}).get("gpus_per_node"))
    return device != "cpu"


def _procs(point: Mapping) -> int:
    p = int(point["procs_per_node"])
    if p < 1:
        raise ValueError(f"point {point.get('point_id')}: procs_per_node must be >= 1, got {p}")
    return p


def _nodes(point: Mapping) -> int:
    k = int(point.get("nodes", 1))
    if k < 1:
        raise ValueError(f"point {point.get('point_id')}: nodes must be >= 1, got {k}")
    return k


def cpus_per_task(point: Mapping, site: Mapping | None = None) -> int:
    """Cores for the one task per node that runs torchrun with P processes."""
    site = _site(point, site)
    p = _procs(point)
    per_proc = site.get("cpus_per_proc")
    if per_proc is None:
        gpn = site.get("gpus_per_node") or point.get("platform", {}).get("devices_per_node")
        if _is_gpu(point, site) and site.get("cpus_per_node") and gpn:
            per_proc = max(1, int(site["cpus_per_node"]) // int(gpn))
        else:
            per_proc = 1
    return p * per_proc


def job_resources(point: Mapping, site: Mapping | None = None) -> dict:
    """Snakemake resources of a point's training job for the ``slurm`` executor plugin.

    Units: ``mem_mb`` MB per node, ``runtime`` minutes. Multi-node points carry ``mpi="srun"``
    so the plugin's jobstep does not wrap the rule in ``srun`` (:func:`launch_argv` calls srun
    itself); GPUs are requested per node (``gres``) with ``tasks_per_gpu=0``."""
    site = _site(point, site)
    k, p = _nodes(point), _procs(point)
    gpu = _is_gpu(point, site)
    gpn = site.get("gpus_per_node") or point.get("platform", {}).get("devices_per_node")
    if gpu and gpn and p > int(gpn):
        raise ValueError(f"point {point.get('point_id')}: procs_per_node={p} exceeds "
                         f"site.gpus_per_node={gpn}; raise it or spread the point over more nodes")
    res: dict = {
        "nodes": k,
        "tasks": k,
        "cpus_per_task": cpus_per_task(point, site),
    }
    if site.get("mem_per_proc_mb"):
        res["mem_mb"] = p * site["mem_per_proc_mb"]
    elif site.get("mem_per_node_mb"):
        frac = p / int(gpn) if gpu and gpn else 1.0
        res["mem_mb"] = max(1, int(site["mem_per_node_mb"] * min(frac, 1.0)))
    elif gpu:
        res["mem_mb"] = 0  # no --mem: the cluster default (often the whole node)
    else:
        res["mem_mb"] = p * DEFAULT_CPU_MEM_PER_PROC_MB + 512  # + the torchrun launcher
    timeout_s = float(point.get("platform", {}).get("timeout_s") or 3600)
    margin = site.get("runtime_margin_min")
    res["runtime"] = math.ceil(timeout_s / 60) + (DEFAULT_RUNTIME_MARGIN_MIN if margin is None
                                                  else margin)
    extra = []
    if gpu:
        res["tasks_per_gpu"] = 0
        if site["gpu_request"] == "gres":
            res["gres"] = f"gpu:{p}"
        elif site["gpu_request"] == "gpus-per-node":
            extra.append(f"--gpus-per-node={p}")
    if k > 1:
        res["mpi"] = "srun"
    for key, name in (("partition", "slurm_partition"), ("account", "slurm_account"),
                      ("constraint", "constraint"), ("qos", "qos")):
        if site.get(key):
            res[name] = str(site[key])
    if site.get("exclusive"):
        extra.append("--exclusive")
    if site.get("extra"):
        extra.append(str(site["extra"]))
    if extra:
        res["slurm_extra"] = " ".join(extra)
    return res


#: Every resource name :func:`job_resources` may set (the train rule declares them all; a
#: callable returning None drops the resource for that job, which matters for ``mpi``: the
#: jobstep wrapper tests its presence, not its value).
RESOURCE_KEYS = ("nodes", "tasks", "cpus_per_task", "mem_mb", "runtime", "tasks_per_gpu", "gres",
                 "mpi", "slurm_partition", "slurm_account", "constraint", "qos", "slurm_extra")


def rule_resources(point_of) -> dict:
    """``{name: callable(wildcards)}`` for a Snakemake rule's ``resources:``, from
    ``point_of(wildcards) -> point``: ``resources: **launch.rule_resources(lambda w: P[w.pid])``."""
    def one(key):
        return lambda wildcards: job_resources(point_of(wildcards)).get(key)
    return {key: one(key) for key in RESOURCE_KEYS}


def rdzv_port(point: Mapping, environ: Mapping, site: Mapping | None = None) -> int:
    """Rendezvous port of a multi-node point: the site's, else 29500 + job id mod 3000
    (below Linux's ephemeral range 32768+, distinct for concurrent jobs)."""
    site = _site(point, site)
    if site.get("rdzv_port"):
        return int(site["rdzv_port"])
    return 29500 + int(environ["SLURM_JOB_ID"]) % 3000


def launch_argv(point: Mapping, run_dir: str | os.PathLike, *, python: str = sys.executable,
                environ: Mapping = os.environ, site: Mapping | None = None,
                module: str = "scalestudy.train") -> list[str]:
    """The argv that starts all ranks of ``point`` (run it with :func:`launch_env`).

    ``module`` is the per-rank entry point (``python -m module POINT_JSON RUN_DIR``)."""
    k, p = _nodes(point), _procs(point)
    run_dir = Path(run_dir)
    site = _site(point, site)
    tail = [*shlex.split(site.get("torchrun_extra") or ""),
            "-m", module, str(run_dir / "point.json"), str(run_dir)]
    pid = str(point["point_id"])
    if k == 1:
        return [python, "-m", "torch.distributed.run", "--nnodes", "1",
                "--nproc-per-node", str(p), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", pid,
                "--local-addr", "127.0.0.1", "--max-restarts", "0", *tail]
    if not environ.get("SLURM_JOB_ID"):  # no allocation: emulate the nodes on this host
        return [python, "-m", "scalestudy.launch", "local-nodes", "--nnodes", str(k),
                "--nproc-per-node", str(p), "--rdzv-id", pid, "--", *tail]
    srun = ["srun", "--nodes", str(k), "--ntasks", str(k), "--ntasks-per-node", "1",
            "--cpus-per-task", str(cpus_per_task(point, site)), "--kill-on-bad-exit=1",
            "--job-name", f"ss-{pid}"[:64]]
    if _is_gpu(point, site) and site["gpu_request"] == "gres":
        srun.append(f"--gres=gpu:{p}")
    elif _is_gpu(point, site) and site["gpu_request"] == "gpus-per-node":
        srun.append(f"--gpus-per-node={p}")
    if site.get("srun_extra"):
        srun += shlex.split(str(site["srun_extra"]))
    return [*srun, python, "-m", "scalestudy.launch", "node",
            "--nnodes", str(k), "--nproc-per-node", str(p),
            "--rdzv-id", f"{environ['SLURM_JOB_ID']}-{pid}",
            "--port", str(rdzv_port(point, environ, site)), "--", *tail]


def _available_cpus(environ: Mapping) -> int:
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(environ["SLURM_CPUS_PER_TASK"])
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def env_additions(point: Mapping, environ: Mapping = os.environ,
                  site: Mapping | None = None) -> dict:
    """What :func:`launch_env` adds to ``environ`` for the launch of ``point``.

    ``OMP_NUM_THREADS`` = cores per process (an explicit value in ``environ`` wins; several
    processes on few cores get 1, DESIGN §6); ``GLOO_SOCKET_IFNAME=lo`` for CPU points that run
    on this host; then the site's ``env`` (NCCL/RCCL settings), which wins over everything here."""
    site = _site(point, site)
    p = _procs(point)
    env: dict[str, str] = {}
    if not environ.get("OMP_NUM_THREADS"):
        if _nodes(point) > 1 and environ.get("SLURM_JOB_ID"):
            cores, procs = cpus_per_task(point, site), p  # per node, as srun gives it
        else:  # one host runs every process (a single node or emulated nodes)
            cores, procs = _available_cpus(environ), p * _nodes(point)
        env["OMP_NUM_THREADS"] = str(max(1, cores // procs))
    local = _nodes(point) == 1 or not environ.get("SLURM_JOB_ID")
    if local and not _is_gpu(point, site) and not environ.get("GLOO_SOCKET_IFNAME"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    env.update(site["env"])
    return env


def launch_env(point: Mapping, environ: Mapping = os.environ,
               site: Mapping | None = None) -> dict:
    """The full environment to launch ``point`` with: ``environ`` (PATH, PYTHONPATH and, under
    Slurm, SLURM_JOB_ID, which srun needs to start a step inside the job's allocation instead
    of asking for a new one) plus :func:`env_additions`."""
    return {**environ, **env_additions(point, environ, site)}


def slurm_env_record(environ: Mapping = os.environ) -> dict | None:
    """What a rank sees of Slurm (for ``env.json``), or None outside Slurm."""
    if not environ.get("SLURM_JOB_ID"):
        return None
    names = {
        "job_id": "SLURM_JOB_ID", "job_name": "SLURM_JOB_NAME",
        "job_nodelist": "SLURM_JOB_NODELIST", "job_num_nodes": "SLURM_JOB_NUM_NODES",
        "partition": "SLURM_JOB_PARTITION", "account": "SLURM_JOB_ACCOUNT",
        "step_id": "SLURM_STEP_ID", "step_nodelist": "SLURM_STEP_NODELIST",
        "step_num_nodes": "SLURM_STEP_NUM_NODES", "ntasks": "SLURM_NTASKS",
        "node_id": "SLURM_NODEID", "procid": "SLURM_PROCID", "nodename": "SLURMD_NODENAME",
        "cpus_per_task": "SLURM_CPUS_PER_TASK", "job_gpus": "SLURM_JOB_GPUS",
        "step_gpus": "SLURM_STEP_GPUS", "gpus_on_node": "SLURM_GPUS_ON_NODE",
        "cuda_visible_devices": "CUDA_VISIBLE_DEVICES",
        "rocr_visible_devices": "ROCR_VISIBLE_DEVICES",
        "hip_visible_devices": "HIP_VISIBLE_DEVICES",
    }
    return {key: environ[var] for key, var in names.items() if var in environ}


# ---------------------------------------------------------------------------------------------
# Inside each srun task of a multi-node point.

def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a Slurm node list (``n[1-2]`` -> ``['n1', 'n2']``), via scontrol."""
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=30, check=True).stdout
    return out.split()


def node_addr(node: str) -> str:
    """The address Slurm reaches ``node`` at (its ``NodeAddr``), else the name itself."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return node
    for field in out.split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1] or node
    return node


def _is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return addr == "localhost"


def node_argv(*, nnodes: int, nproc_per_node: int, rdzv_id: str, port: int, train: list[str],
              environ: Mapping, python: str = sys.executable) -> tuple[list[str], dict]:
    """The torchrun argv (and env additions) of this node of a multi-node point.

    Reads ``SLURM_JOB_NODELIST`` and ``SLURMD_NODENAME`` (set by slurmstepd in each srun
    task). The first node of the allocation hosts the c10d store (``is_host=1``); when Slurm
    reaches the nodes over loopback (emulated nodes on one host) torchrun and gloo use it too."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("scalestudy.launch node: SLURM_JOB_NODELIST is unset; "
                           "run it as an srun task inside the point's allocation")
    hosts = expand_nodelist(nodelist)
    me = environ.get("SLURMD_NODENAME") or socket.gethostname()
    first = hosts[0]
    first_addr, my_addr = node_addr(first), node_addr(me)
    argv = [python, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{first_addr}:{port}", "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host={1 if me == first else 0}", "--max-restarts", "0"]
    env = {}
    if _is_loopback(my_addr):
        argv += ["--local-addr", my_addr]
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return argv + list(train), env


def _node_main(args: argparse.Namespace) -> int:
    train = list(args.train)
    if train and train[0] == "--":
        train = train[1:]
    argv, env = node_argv(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                          rdzv_id=args.rdzv_id, port=args.port, train=train,
                          environ=os.environ)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    print(f"scalestudy.launch node {os.environ.get('SLURMD_NODENAME', '?')}: {shlex.join(argv)}",
          file=sys.stderr, flush=True)
    os.execvp(argv[0], argv)
    return 127  # not reached


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def local_nodes_argvs(*, nnodes: int, nproc_per_node: int, rdzv_id: str, port: int,
                      train: list[str], python: str = sys.executable) -> list[list[str]]:
    """One torchrun argv per emulated node: the same c10d rendezvous as on a cluster, over
    loopback; the first launcher hosts the store."""
    return [[python, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
             "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id,
             "--rdzv-conf", f"is_host={1 if i == 0 else 0}", "--local-addr", "127.0.0.1",
             "--max-restarts", "0", *train] for i in range(nnodes)]


def _local_nodes_main(args: argparse.Namespace) -> int:
    """Run the emulated nodes; like ``srun --kill-on-bad-exit``, the first failure stops the
    rest. Exit status: the first non-zero one, else 0."""
    import signal
    import time
    train = list(args.train)
    if train and train[0] == "--":
        train = train[1:]
    argvs = local_nodes_argvs(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                              rdzv_id=args.rdzv_id, port=args.port or free_port(), train=train)
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = []

    def stop_all(*_):
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()

    def on_term(signum, _frame):
        stop_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    for i, argv in enumerate(argvs):
        print(f"scalestudy.launch local-nodes [{i}]: {shlex.join(argv)}", file=sys.stderr,
              flush=True)
        procs.append(subprocess.Popen(argv, env=env))
    rc = 0
    try:
        while any(proc.poll() is None for proc in procs):
            bad = [proc.returncode for proc in procs if proc.returncode not in (None, 0)]
            if bad:
                rc = bad[0]
                print(f"scalestudy.launch local-nodes: a node exited {rc}; stopping the rest",
                      file=sys.stderr, flush=True)
                stop_all()
                break
            time.sleep(0.2)
    finally:
        stop_all()
    rc = rc or next((proc.returncode for proc in procs if proc.returncode), 0)
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalestudy.launch")
    sub = parser.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node", help="start this node's torchrun (inside an srun task)")
    node.add_argument("--nnodes", type=int, required=True)
    node.add_argument("--nproc-per-node", type=int, required=True)
    node.add_argument("--rdzv-id", required=True)
    node.add_argument("--port", type=int, required=True)
    node.add_argument("train", nargs=argparse.REMAINDER,
                      help="-- then torchrun's script args, e.g. -m scalestudy.train P R")
    loc = sub.add_parser("local-nodes", help="emulate several nodes on this host (no Slurm)")
    loc.add_argument("--nnodes", type=int, required=True)
    loc.add_argument("--nproc-per-node", type=int, required=True)
    loc.add_argument("--rdzv-id", required=True)
    loc.add_argument("--port", type=int, default=0, help="0: a free port")
    loc.add_argument("train", nargs=argparse.REMAINDER)
    show = sub.add_parser("show", help="print the launch line and resources of a point.json")
    show.add_argument("point_json")
    show.add_argument("run_dir", nargs="?")
    args = parser.parse_args(argv)
    if args.cmd == "node":
        return _node_main(args)
    if args.cmd == "local-nodes":
        return _local_nodes_main(args)
    import json
    point = json.loads(Path(args.point_json).read_text())
    run_dir = Path(args.run_dir or Path(args.point_json).parent)
    print("resources:", json.dumps(job_resources(point)))
    print("env:", json.dumps(launch_env(point)))
    print("argv:", shlex.join(launch_argv(point, run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
