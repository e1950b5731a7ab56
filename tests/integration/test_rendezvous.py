"""The rendezvous does not listen beyond where it must.

torch's TCPStore server listens on every interface (``*:port``) whatever host it is given;
``scalestudy.run.torchrun`` binds torchrun's two stores to the rendezvous address. Here real
points run (a single-node point, emulated nodes, and the Slurm ``node`` command with a fake
``scontrol``) and every listening TCP socket of their processes is read from ``/proc``
(what ``ss -ltnp`` shows): all must be on loopback, gloo's included. The multi-node port
agreement (a free port bound by the first node at job start, shared through a file in the run
folder) is checked on its own too."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.run import launch, nodes, torchrun

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

PROBE = '''
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
run = sys.argv[2]
with open(os.path.join(run, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t.item(),
               "pid": os.getpid()}, f)
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(run, "go")) and time.monotonic() < deadline:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
'''


# --- reading the listening sockets of a process tree (as ss -ltnp does) -----------------------

def _addr(hex_addr: str) -> str:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ipaddress.IPv4Address(raw[::-1])
    else:  # four little-endian 32-bit words
        ip = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
    return f"{ip}:{int(port, 16)}"


def listening() -> dict[int, str]:
    """inode -> 'address:port' of every listening TCP socket of this host."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A":  # TCP_LISTEN
                out[int(f[9])] = _addr(f[1])
    return out


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        out.add(pid)
        todo += children.get(pid, [])
    return out


def sockets_of(pids: set[int]) -> dict[int, list[str]]:
    """pid -> the listening addresses it holds."""
    table = listening()
    out: dict[int, list[str]] = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in table:
                    out.setdefault(pid, []).append(table[inode])
    return out


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.rsplit(":", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_proc_reader_sees_wildcard_and_loopback_sockets():
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        a.listen()
        b.bind(("0.0.0.0", 0))
        b.listen()
        mine = sockets_of({os.getpid()})[os.getpid()]
        assert f"127.0.0.1:{a.getsockname()[1]}" in mine
        assert f"0.0.0.0:{b.getsockname()[1]}" in mine
    assert is_loopback("127.0.0.1:1") and is_loopback("::1:1") and is_loopback("::ffff:127.0.0.1:1")
    assert not is_loopback("0.0.0.0:1") and not is_loopback(":::1")


# --- the store wrapper -------------------------------------------------------------------------

def test_tcp_store_listens_on_its_host_only():
    store = torchrun.tcp_store("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    try:
        mine = sockets_of({os.getpid()}).get(os.getpid(), [])
        assert f"127.0.0.1:{store.port}" in mine
        assert all(is_loopback(a) for a in mine), mine
        store.set("k", "v")
        from torch.distributed import TCPStore
        assert TCPStore("127.0.0.1", store.port, is_master=False).get("k") == b"v"
    finally:
        del store


def test_torchrun_wrapper_patches_both_stores():
    assert torchrun.install() == []  # this torch has both patch points


# --- the multi-node port ------------------------------------------------------------------------

def test_first_node_binds_a_free_port_and_tells_the_others(tmp_path):
    env = {"SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "3"}
    path = nodes.port_file(tmp_path, env)
    assert path == tmp_path / ".rdzv-port-1234.3"
    port, sock = nodes.agree_port(is_first=True, host="127.0.0.1", path=path)
    try:
        assert sock.getsockname() == ("127.0.0.1", port)  # bound on the host's address only
        assert port != 29500 + 1234 % 3000 and path.read_text().strip() == str(port)
        other, none = nodes.agree_port(is_first=False, host="127.0.0.1", path=path)
        assert (other, none) == (port, None)
        # the port is held: nobody else can take it before torchrun listens on it
        with pytest.raises(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port))
    finally:
        sock.close()


def test_other_nodes_wait_for_the_port_and_give_up(tmp_path):
    path = tmp_path / ".rdzv-port-1.0"
    with pytest.raises(RuntimeError, match="no rendezvous port from the first node"):
        nodes.agree_port(is_first=False, host="x", path=path, timeout_s=0.3)
    path.write_text("not a port\n")
    with pytest.raises(RuntimeError):
        nodes.agree_port(is_first=False, host="x", path=path, timeout_s=0.3)
    # a fixed site port needs no file
    assert nodes.agree_port(is_first=False, host="x", path=path, port=6001) == (6001, None)


def test_first_node_with_a_fixed_port_binds_it(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    port, sock = nodes.agree_port(is_first=True, host="127.0.0.1", path=tmp_path / "p",
                                  port=free)
    sock.close()
    assert port == free


# --- real points: every listening socket on loopback -----------------------------------------

def _run_and_inspect(argv_list: list[list[str]], envs: list[dict], run_dir: Path, world: int,
                     timeout_s: float = 200) -> dict[int, list[str]]:
    """Start the launchers, wait until every rank has joined, read the sockets of all their
    processes, let the ranks finish; returns pid -> listening addresses."""
    procs = [subprocess.Popen(a, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for a, e in zip(argv_list, envs)]
    try:
        deadline = time.monotonic() + timeout_s
        while len(list(run_dir.glob("rank*.json"))) < world:
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise AssertionError("launch failed: " + "".join(
                    (p.communicate(timeout=30)[0] or "")[-3000:] for p in procs))
            time.sleep(0.2)
        # every rank has joined (its file is written after init and an all-reduce), so every
        # socket of the launchers and ranks is open now: read them (no settling sleep)
        tree: set[int] = set()
        for p in procs:
            tree |= descendants(p.pid)
        found = sockets_of(tree)
    finally:
        (run_dir / "go").touch()
        for p in procs:
            try:
                out = p.communicate(timeout=120)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                out = p.communicate()[0]
            assert p.returncode == 0, out[-3000:]
    recs = [json.loads(f.read_text()) for f in run_dir.glob("rank*.json")]
    assert sorted(r["rank"] for r in recs) == list(range(world))
    assert all(r["sum"] == world * (world + 1) / 2 for r in recs)
    return found


def _setup(tmp_path: Path):
    (tmp_path / "ss_probe.py").write_text(PROBE)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "GLOO_", "NCCL_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(Path(launch.__file__)
                                                                  .parents[2])])
    return run_dir, environ


def _assert_loopback_only(found: dict[int, list[str]], ranks: int, one_launcher: bool):
    addrs = [a for v in found.values() for a in v]
    assert all(is_loopback(a) for a in addrs), found
    # not vacuous: torchrun's two stores (the rendezvous store and the workers' store, in the
    # one launcher of a single-node point) and gloo's own socket in every rank
    assert len(addrs) >= 2 + ranks, found
    if one_launcher:
        assert max(len(v) for v in found.values()) >= 2, found


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_single_node_point_listens_on_loopback_only(tmp_path):
    run_dir, environ = _setup(tmp_path)
    point = Point.for_layout(Model(), dp=2, device="cpu", devices_per_node=2,
                             point_id="probe-1x2")
    argv = launch.launch_argv(point, run_dir, environ=environ, module="ss_probe")
    env = launch.launch_env(point, environ)
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    found = _run_and_inspect([argv], [env], run_dir, 2)
    _assert_loopback_only(found, ranks=2, one_launcher=True)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_emulated_nodes_listen_on_loopback_only(tmp_path):
    run_dir, environ = _setup(tmp_path)
    point = Point.for_layout(Model(), dp=2, device="cpu", devices_per_node=1, max_nodes=2,
                             point_id="probe-2x1")
    argv = launch.launch_argv(point, run_dir, environ=environ, module="ss_probe")
    assert argv[2:5] == ["scalestudy", "nodes", "local-nodes"]
    found = _run_and_inspect([argv], [launch.launch_env(point, environ)], run_dir, 2)
    _assert_loopback_only(found, ranks=2, one_launcher=False)


FAKE_SCONTROL = '''#!/bin/sh
# scontrol show hostnames LIST | scontrol show node -o NAME, for two nodes on loopback
if [ "$2" = hostnames ]; then printf 'n1\\nn2\\n'; else echo "NodeName=$4 NodeAddr=127.0.0.1"; fi
'''


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_slurm_node_tasks_agree_on_a_free_port(tmp_path):
    """Two ``scalestudy nodes node`` tasks as srun starts them (a fake ``scontrol`` puts
    both nodes on loopback): the first binds a free port and writes it to the run folder, the
    second reads it, the ranks all-reduce, and nothing listens beyond loopback."""
    run_dir, environ = _setup(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ.get('PATH', '')}"
    point = Point.for_layout(Model(), dp=2, device="cpu", devices_per_node=1, max_nodes=2,
                             point_id="probe-2x1")
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    argv = launch.launch_argv(point, run_dir, environ=slurm, module="ss_probe")
    task = argv[argv.index(sys.executable):]  # what srun runs on each node
    assert task[2:5] == ["scalestudy", "nodes", "node"] and "--port" not in task
    envs = [{**launch.launch_env(point, {**environ, **slurm}), "SLURMD_NODENAME": name}
            for name in ("n2", "n1")]  # the second node may well start first
    found = _run_and_inspect([task, task], envs, run_dir, 2)
    _assert_loopback_only(found, ranks=2, one_launcher=False)
    port = int((run_dir / ".rdzv-port-4242.0").read_text())
    assert port != 29500 + 4242 % 3000
    assert any(a.endswith(f":{port}") for v in found.values() for a in v)


def test_microbenchmarks_use_the_loopback_launcher():
    argv = launch.local_torchrun(4, "py")
    assert argv[:5] == ["py", "-m", "scalestudy", "torchrun", "--"]
    assert "--standalone" not in argv  # its workers' store would follow the host name
    i = argv.index("--rdzv-endpoint")
    assert argv[i + 1] == "127.0.0.1:0" and argv[argv.index("--local-addr") + 1] == "127.0.0.1"
    rule = (Path(launch.__file__).parents[3] / "workflow" / "rules" / "microbench.smk")
    if rule.exists():
        text = rule.read_text()
        assert "local_torchrun" in text and "torch.distributed.run" not in text
