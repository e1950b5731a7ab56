"""Multi-node launches: inside each ``srun`` task of a Slurm allocation (``node``), or several
emulated nodes on this host (``local-nodes``).

    scalestudy nodes node --nnodes K --nproc-per-node P --rdzv-id ID --rdzv-dir RUN_DIR [--port PORT] -- -m scalestudy.train ...
    scalestudy nodes local-nodes --nnodes K --nproc-per-node P --rdzv-id ID -- ...
    scalestudy nodes show RUN_DIR/point.json      # the launch line and resources

Each srun task reads the allocation's node list *inside the task* (Snakemake's Slurm jobstep
wrapper strips the ``SLURM_*`` layout variables from the rule's shell), takes the first node
as the c10d rendezvous host and replaces itself with ``torchrun --nnodes K --nproc-per-node P
--rdzv-backend c10d --rdzv-endpoint <first node>:<port> --rdzv-id <SLURM_JOB_ID>-<point_id>
--local-addr <this node>`` (``scalestudy.run.torchrun``: the stores listen on those addresses
only, not on every interface).

The port: unless the site fixes one (``site.rdzv_port``), the first node's task binds the
rendezvous socket on its own address at a port the kernel picks (at job start: not guessable
from the job id, and never raced for, since the socket stays bound and is handed to torchrun
as an inherited fd), then writes the number to ``RUN_DIR/.rdzv-port-<job>.<step>`` on the
shared filesystem; the other tasks wait for that file (:func:`agree_port`).

Outside Slurm, K torchrun launchers on this host use the same multi-node c10d rendezvous over
loopback (same ranks and collectives, so a point runs on a laptop and a cluster alike).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

from scalestudy.run import lifetime
from scalestudy.run.launch import TORCHRUN
from scalestudy.run.torchrun import LISTEN_FD_ENV, bind_socket

#: torchrun with its stores bound to the rendezvous address (``scalestudy.run.torchrun``).
#: How long the other nodes wait for the first node's port file (seconds).
PORT_FILE_TIMEOUT_S = 600.0

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


def placement(environ: Mapping) -> dict:
    """This srun task's view of the allocation: ``first`` (the rendezvous host's name),
    ``me``, their addresses ``first_addr`` / ``my_addr`` and ``is_first``.

    Reads ``SLURM_JOB_NODELIST`` and ``SLURMD_NODENAME`` (set by slurmstepd in each task)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise RuntimeError("scalestudy.run.nodes node: SLURM_JOB_NODELIST is unset; "
                           "run it as an srun task inside the point's allocation")
    hosts = expand_nodelist(nodelist)
    me = environ.get("SLURMD_NODENAME") or socket.gethostname()
    first = hosts[0]
    return {"first": first, "me": me, "first_addr": node_addr(first), "my_addr": node_addr(me),
            "is_first": me == first}


def node_argv(*, nnodes: int, nproc_per_node: int, rdzv_id: str, port: int, train: list[str],
              environ: Mapping, python: str = sys.executable,
              where: Mapping | None = None) -> tuple[list[str], dict]:
    """The torchrun argv (and env additions) of this node of a multi-node point.

    The first node of the allocation hosts the c10d store (``is_host=1``) on its own address;
    every node names its address (``--local-addr``) so the store the workers share listens
    there only; when Slurm reaches the nodes over loopback (emulated nodes on one host) gloo
    uses it too. ``where``: :func:`placement` (read from ``environ`` when not given)."""
    where = where or placement(environ)
    argv = [python, *TORCHRUN, "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{where['first_addr']}:{port}", "--rdzv-id", rdzv_id,
            "--rdzv-conf", f"is_host={1 if where['is_first'] else 0}",
            "--local-addr", where["my_addr"], "--max-restarts", "0"]
    env = {}
    if _is_loopback(where["my_addr"]):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return argv + list(train), env


def port_file(rdzv_dir: str | os.PathLike, environ: Mapping) -> Path:
    """Where the first node leaves the rendezvous port for the others: one file per Slurm job
    step in the point's run folder (a retry is a new step; the runner clears dot files before
    each attempt)."""
    job = environ.get("SLURM_JOB_ID", "0")
    step = environ.get("SLURM_STEP_ID", "0")
    return Path(rdzv_dir) / f".rdzv-port-{job}.{step}"


def agree_port(*, is_first: bool, host: str, path: Path, port: int = 0,
               timeout_s: float = PORT_FILE_TIMEOUT_S) -> tuple[int, socket.socket | None]:
    """The rendezvous port every node of a point uses, and (on the first node) the socket
    already bound to it on ``host``, for torchrun to listen on.

    First node: bind ``host:port`` (0: a free port the kernel picks now), then write the port
    to ``path`` atomically. Other nodes: ``port`` when the site fixed one, else wait up to
    ``timeout_s`` for ``path``."""
    if is_first:
        sock = bind_socket(host, port)
        chosen = sock.getsockname()[1]
        from scalestudy.record.io import write_text

        write_text(path, f"{chosen}\n")
        return chosen, sock
    if port:
        return port, None
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = path.read_text().strip()
        except OSError:
            text = ""
        if text.isdigit() and 0 < int(text) < 65536:
            return int(text), None
        if time.monotonic() > deadline:
            raise RuntimeError(f"scalestudy.run.nodes node: no rendezvous port from the first "
                               f"node in {path} after {timeout_s:.0f} s")
        time.sleep(0.2)


def start_node(*, nnodes: int, nproc_per_node: int, rdzv_id: str, port: int,
               rdzv_dir: str | None, train: list[str]) -> int:
    """Replace this process (one srun task) with its node's torchrun; ``train`` is torchrun's
    script part (``-m scalestudy.train POINT RUN_DIR``)."""
    where = placement(os.environ)
    sock = None
    if rdzv_dir:
        port, sock = agree_port(is_first=where["is_first"], host=where["first_addr"],
                                path=port_file(rdzv_dir, os.environ), port=port)
    argv, env = node_argv(nnodes=nnodes, nproc_per_node=nproc_per_node,
                          rdzv_id=rdzv_id, port=port, train=train,
                          environ=os.environ, where=where)
    for key, value in env.items():
        os.environ.setdefault(key, value)
    if sock is not None:  # torchrun's rendezvous store listens on this very socket
        os.set_inheritable(sock.fileno(), True)
        os.environ[LISTEN_FD_ENV] = str(sock.detach())
    print(f"scalestudy nodes node {os.environ.get('SLURMD_NODENAME', '?')}: {shlex.join(argv)}",
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
    return [[python, *TORCHRUN, "--nnodes", str(nnodes),
             "--nproc-per-node", str(nproc_per_node), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id,
             "--rdzv-conf", f"is_host={1 if i == 0 else 0}", "--local-addr", "127.0.0.1",
             "--max-restarts", "0", *train] for i in range(nnodes)]


def run_local_nodes(*, nnodes: int, nproc_per_node: int, rdzv_id: str, port: int,
                    train: list[str]) -> int:
    """Run the emulated nodes; like ``srun --kill-on-bad-exit``, the first failure stops the
    rest. Exit status: the first non-zero one, else 0."""
    import signal
    import time
    # the first launcher's store listens on this socket, bound now: no other process can
    # take the port between choosing and binding it
    sock = bind_socket("127.0.0.1", port or 0)
    argvs = local_nodes_argvs(nnodes=nnodes, nproc_per_node=nproc_per_node,
                              rdzv_id=rdzv_id, port=sock.getsockname()[1], train=train)
    env = dict(os.environ)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    lock = env.get(lifetime.POINT_LOCK_FD_ENV, "")
    lock_fds = (int(lock),) if lock.isdigit() else ()
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
        print(f"scalestudy nodes local-nodes [{i}]: {shlex.join(argv)}", file=sys.stderr,
              flush=True)
        # each launcher stops (SIGTERM: its ranks with it) when this process ends, killed or not,
        # and holds the point's lock (scalestudy.run.lifetime)
        keep = (*lock_fds, sock.fileno()) if i == 0 else lock_fds
        procs.append(subprocess.Popen(
            argv, env={**env, LISTEN_FD_ENV: str(sock.fileno())} if i == 0 else env,
            pass_fds=keep, preexec_fn=lifetime.dies_with_parent(signal.SIGTERM)))
        if i == 0:
            sock.close()  # the first launcher holds it now
    rc = 0
    try:
        while any(proc.poll() is None for proc in procs):
            bad = [proc.returncode for proc in procs if proc.returncode not in (None, 0)]
            if bad:
                rc = bad[0]
                print(f"scalestudy nodes local-nodes: a node exited {rc}; stopping the rest",
                      file=sys.stderr, flush=True)
                stop_all()
                break
            time.sleep(0.2)
    finally:
        stop_all()
    rc = rc or next((proc.returncode for proc in procs if proc.returncode), 0)
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention
