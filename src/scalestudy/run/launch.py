"""The command lines that start a point: torchrun on one node, ``srun`` + torchrun on several.

- One node (``point.nodes == 1``): ``python -m scalestudy torchrun -- --nnodes 1
  --nproc-per-node P`` (torchrun whose stores listen on the address they are given,
  ``scalestudy.run.torchrun``) with a c10d rendezvous on ``127.0.0.1:0`` (the rendezvous store
  binds a free port chosen by the kernel at bind time, so concurrent points never race for a
  port; this is what ``torchrun --standalone`` does, with the loopback address) and
  ``--local-addr 127.0.0.1`` so the workers' store is on loopback too; gloo and NCCL are told
  ``lo`` (:func:`env_additions`): nothing of a single-node point listens beyond loopback.
- Several nodes inside a Slurm allocation (``SLURM_JOB_ID`` set): ``srun --nodes K --ntasks K
  --ntasks-per-node 1 --cpus-per-task C --kill-on-bad-exit=1 python -m scalestudy nodes
  node`` (``scalestudy.run.nodes``); the first node binds the rendezvous store on its own
  address at a port the kernel picks at job start and tells the others through a file in the
  run folder (or ``site.rdzv_port``); ``--exclude`` names the nodes the node check found slow
  (``scalestudy.run.health``).
- Several nodes outside Slurm (a laptop, CI): ``python -m scalestudy nodes local-nodes``
  starts K torchrun launchers on this host.
- :func:`launch_env` gives the environment of the launch.

The per-rank script is the built-in trainer (``-m scalestudy.train POINT_JSON RUN_DIR``) or,
for a ``command`` workload, the study's argv filled from the point
(``scalestudy.config.template``), run by torchrun as it is (``--no-python ARGV``): the same
launcher, rendezvous and Slurm steps either way.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Mapping

from scalestudy.config import sitepolicy
from scalestudy.config.point import Point
from scalestudy.config.template import command_argv
from scalestudy.config.vocab import GPURequest
from scalestudy.run import health
from scalestudy.run.slurm import cpus_per_task, is_gpu

#: The per-rank entry point of the built-in trainer (``python -m ENTRY POINT_JSON RUN_DIR``).
TRAINER = "scalestudy.train"
#: torchrun with its stores bound to the rendezvous address (``python *TORCHRUN ARGS``: the
#: ``torchrun`` command, ``scalestudy.commands.torchrun``, hands ARGS to torchrun).
TORCHRUN = ("-m", "scalestudy", "torchrun", "--")
#: the multi-node launchers (``python *NODES node|local-nodes ...``: ``scalestudy.commands.nodes``)
NODES = ("-m", "scalestudy", "nodes")
#: Interface variables of the collective libraries; ``lo`` for points that run on this host.
LOOPBACK_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def script_argv(point: Point, run_dir: str | os.PathLike, python: str = sys.executable,
                module: str = TRAINER) -> list[str]:
    """torchrun's script part for one rank: ``-m scalestudy.train POINT_JSON RUN_DIR``, or
    ``--no-python`` and a command workload's argv (its program run as it is)."""
    run_dir = Path(run_dir)
    if point.workload.is_command:
        return ["--no-python", *command_argv(point, run_dir, python)]
    return ["-m", module, str(run_dir / "point.json"), str(run_dir)]


def local_torchrun(nproc: int, python: str = sys.executable) -> list[str]:
    """torchrun for ``nproc`` processes on this host (the microbenchmarks): a standalone
    rendezvous whose stores listen on loopback only, like a single-node point's. Run it with
    ``GLOO_SOCKET_IFNAME=lo`` / ``NCCL_SOCKET_IFNAME=lo`` (:data:`LOOPBACK_ENV`)."""
    return [python, *TORCHRUN, "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
            "--local-addr", "127.0.0.1", "--max-restarts", "0"]


def rdzv_port(point: Point) -> int | None:
    """The site's fixed rendezvous port of a multi-node point, else None: the first node
    binds a free port at job start (``scalestudy.run.nodes``), so the port is neither
    guessable from the job id nor raced for."""
    return point.platform.site.rdzv_port or None


def launch_argv(point: Point, run_dir: str | os.PathLike, *, python: str = sys.executable,
                environ: Mapping = os.environ, module: str = TRAINER) -> list[str]:
    """The argv that starts all ranks of ``point`` (run it with :func:`launch_env`).

    ``module`` is the per-rank entry point of the built-in trainer (``python -m module
    POINT_JSON RUN_DIR``); a command workload's filled argv takes its place."""
    k, p = point.nodes, point.procs_per_node
    run_dir = Path(run_dir)
    site = point.platform.site
    tail = [*shlex.split(site.torchrun_extra or ""), *script_argv(point, run_dir, python,
                                                                  module)]
    pid = str(point.point_id)
    if k == 1:
        return [*local_torchrun(p, python), "--rdzv-id", pid, *tail]
    if not environ.get("SLURM_JOB_ID"):  # no allocation: emulate the nodes on this host
        return [python, *NODES, "local-nodes", "--nnodes", str(k),
                "--nproc-per-node", str(p), "--rdzv-id", pid, "--", *tail]
    srun = ["srun", "--nodes", str(k), "--ntasks", str(k), "--ntasks-per-node", "1",
            "--cpus-per-task", str(cpus_per_task(p, point.platform)),
            "--kill-on-bad-exit=1", "--job-name", f"ss-{pid}"[:64]]
    gpu = is_gpu(point.platform)
    if gpu and site.gpu_request == GPURequest.GRES:
        srun.append(f"--gres=gpu:{p}")
    elif gpu and site.gpu_request == GPURequest.GPUS_PER_NODE:
        srun.append(f"--gpus-per-node={p}")
    if site.srun_extra:
        srun += shlex.split(site.srun_extra)
    exclude = health.excluded(run_dir)
    if exclude:  # the nodes the node check found slow (scalestudy.run.health)
        srun.append(f"--exclude={','.join(exclude)}")
    port = rdzv_port(point)
    return [*srun, python, *NODES, "node",
            "--nnodes", str(k), "--nproc-per-node", str(p),
            "--rdzv-id", f"{environ['SLURM_JOB_ID']}-{pid}",
            *(["--port", str(port)] if port else []), "--rdzv-dir", str(run_dir), "--", *tail]


def _available_cpus(environ: Mapping) -> int:
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return int(environ["SLURM_CPUS_PER_TASK"])
    from scalestudy.config.devices import usable_cpus

    return usable_cpus()


def threads_per_process(procs: int, devices_per_node: int, environ: Mapping = os.environ) -> int:
    """CPU threads of each of ``procs`` processes that one host (or one Slurm allocation)
    runs: its cores over its process slots. Outside Slurm a host is ``devices_per_node``
    devices and each process (one device) gets one device's share at every N, as a GPU point
    uses one GPU whatever its N: a 1-process point on a 2-core host of 8 devices gets 1
    thread, not 2, so its steps are timed on the same resource as the 4-process point's and
    as the calibration's (``scalestudy.measure.calibrate``); more processes than devices
    share the host. Under Slurm the allocation is already sized per process
    (``slurm.cpus_per_task``)."""
    slots = procs if environ.get("SLURM_JOB_ID") else max(procs, devices_per_node)
    return max(1, _available_cpus(environ) // slots)


def env_additions(point: Point, environ: Mapping = os.environ) -> dict:
    """What :func:`launch_env` adds to ``environ`` for the launch of ``point``.

    ``OMP_NUM_THREADS`` = one process's share of the cores (:func:`threads_per_process`; an
    explicit value in ``environ`` wins; several processes on few cores get 1: two threads per
    process made 4 and 8 processes on 2 cores 19x and 25x slower); the site's ``env``
    (NCCL/RCCL settings), which wins over that; and for points that run on this host (one
    node, or emulated nodes) ``GLOO_SOCKET_IFNAME=lo`` and ``NCCL_SOCKET_IFNAME=lo``, over
    the site's (its interfaces are for a cluster's network) but not over the caller's own
    ``environ``."""
    k, p = point.nodes, point.procs_per_node
    env: dict[str, str] = {}
    if not environ.get("OMP_NUM_THREADS"):
        if k > 1 and environ.get("SLURM_JOB_ID"):  # per node, as srun gives it
            threads = max(1, cpus_per_task(p, point.platform) // p)
        else:  # one host runs every process (a single node or emulated nodes)
            threads = threads_per_process(p * k, point.platform.devices_per_node, environ)
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(sitepolicy.resolve_env(point.platform.site.env, environ))  # secrets put back here
    if k == 1 or not environ.get("SLURM_JOB_ID"):  # every rank on this host
        for var in LOOPBACK_ENV:
            if not environ.get(var):
                env[var] = "lo"
    return env


def launch_env(point: Point, environ: Mapping = os.environ) -> dict:
    """The full environment to launch ``point`` with: ``environ`` (PATH, PYTHONPATH and, under
    Slurm, SLURM_JOB_ID, which srun needs to start a step inside the job's allocation instead
    of asking for a new one) plus :func:`env_additions`; never the study's secrets as a whole
    (``sitepolicy.SECRETS_ENV``: each rank gets the ones its site.env names)."""
    env = {**environ, **env_additions(point, environ)}
    env.pop(sitepolicy.SECRETS_ENV, None)
    return env
