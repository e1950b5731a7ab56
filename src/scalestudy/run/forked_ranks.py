"""The built-in trainer's ranks on a CPU point start by ``fork`` from a preloaded process, not
by ``exec`` of a new interpreter.

A rank's own work on a CPU point is small; its start is not: a new interpreter imports torch
(~1.4 s CPU on the 2-core dev host) and, at the optimizer's or DDP's first call, torch._dynamo
(~1.4 s more, ``torch._disable_dynamo``), with the project's modules after them. A point of
P processes pays that P times on cores its ranks share. Here torchrun's agent forks, before
it starts any thread, one preloading process (the zygote) that imports those modules once
and then forks each rank of the point from that single-threaded state: the rank runs
``-m scalestudy.train POINT_JSON RUN_DIR`` as the exec'd one would (its argv, environment,
stdout/stderr files, new session, the point's lock), with its imports done.

Each rank stays torchrun's child: the agent is a child subreaper (``PR_SET_CHILD_SUBREAPER``)
and the zygote double-forks, so a rank is re-parented to the agent before the agent hears of
it; torchrun polls, waits for and signals it (its group) through :class:`ForkedRank`, as it
does a ``Popen``. A rank dies with the agent (``PR_SET_PDEATHSIG`` once it is the agent's
child), the zygote too.

Only CPU points (:func:`serves`): a GPU point's ranks are exec'd, as torch does (a process
that has touched the CUDA driver cannot fork one that uses it, and a GPU rank's start is
small beside its step). A command workload (``--no-python``) is always exec'd.
"""

from __future__ import annotations

import fcntl
import io
import os
import pickle
import runpy
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from typing import Callable

from scalestudy.run import lifetime
from scalestudy.run.launch import TRAINER

#: The largest request the agent sends the zygote (argv and environment, pickled), bytes.
MAX_REQUEST = 1 << 20
#: How long a new rank waits to become the agent's child (s) before it gives up.
REPARENT_S = 10.0


def trainer_point(rest: list[str]) -> str | None:
    """The point JSON of torchrun's argv ``rest`` when its ranks run the built-in trainer
    (``... -m scalestudy.train POINT_JSON RUN_DIR``), else None."""
    for i in range(len(rest) - 2):
        if rest[i] == "-m" and rest[i + 1] == TRAINER:
            return rest[i + 2]
    return None


def serves(rest: list[str]) -> bool:
    """The ranks of torchrun's argv ``rest`` start forked: the built-in trainer on a CPU
    point (its point.json says ``platform.device: cpu``)."""
    path = trainer_point(rest)
    if path is None:
        return False
    from scalestudy.config.point import Point
    from scalestudy.record.io import read_json

    try:
        return Point.from_json(read_json(path), path).platform.device == "cpu"
    except Exception:  # (an unreadable point is the rank's to report, exec'd as ever)
        return False


def is_trainer_argv(args) -> bool:
    """``args`` is torchrun's argv of a built-in trainer rank: ``python [-u] -m
    scalestudy.train POINT_JSON RUN_DIR``."""
    args = list(args)
    return len(args) >= 3 and args[0] == sys.executable and trainer_point(args[1:]) is not None


class ForkedRank:
    """A forked rank as torchrun's agent uses a ``subprocess.Popen``: ``pid``, ``poll``,
    ``wait``, ``returncode`` (negative: the signal that ended it), ``send_signal``."""

    def __init__(self, pid: int, args):
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: gone, its status lost
                self.returncode = 255
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The preloading process of one torchrun agent (:func:`start`)."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid = pid
        self._sock = sock

    def start_rank(self, args, env: dict, stdout, stderr, keep_fds=()) -> ForkedRank:
        """Fork a rank running ``args`` (a built-in trainer rank's argv) with ``env``, its
        stdout and stderr to the files ``stdout``/``stderr`` (None: the agent's), and the
        descriptors ``keep_fds`` (the point's lock) under the same numbers. Raises OSError
        when the zygote is gone."""
        fds = [f.fileno() for f in (stdout, stderr) if f is not None] + list(keep_fds)
        request = pickle.dumps({"args": list(args), "env": dict(env),
                                "stdout": stdout is not None, "stderr": stderr is not None,
                                "keep": list(keep_fds), "agent": os.getpid()})
        if len(request) > MAX_REQUEST:
            raise OSError(f"rank request of {len(request)} bytes (at most {MAX_REQUEST})")
        socket.send_fds(self._sock, [request], fds)
        answer = self._sock.recv(8)
        if len(answer) != 8:
            raise OSError("the zygote ended without forking the rank")
        (pid,) = struct.unpack("q", answer)
        if pid <= 0:
            raise OSError(f"the zygote could not fork the rank (errno {-pid})")
        return ForkedRank(pid, args)


def start(preload: Callable[[], None]) -> Zygote | None:
    """Fork this agent's zygote, which runs ``preload`` (the ranks' imports) before it forks
    any rank (call it before torchrun starts a thread), and make the agent the subreaper of
    the ranks it forks; None where that is not possible (not Linux)."""
    if not sys.platform.startswith("linux") or not lifetime.become_subreaper():
        return None
    agent_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sys.stdout.flush()
    sys.stderr.flush()
    agent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the zygote
        code = 0
        try:
            agent_end.close()
            lifetime.die_with_parent(signal.SIGKILL, agent)
            _serve(zygote_end, preload)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    zygote_end.close()
    return Zygote(pid, agent_end)


def _serve(sock: socket.socket, preload: Callable[[], None]) -> None:
    """The zygote: run ``preload``, then fork a rank for each request until the agent's end
    of ``sock`` closes."""
    try:
        preload()
    except Exception:  # (a rank imports what it needs itself)
        pass
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 8)
        except OSError:
            return
        if not data:
            return
        request = pickle.loads(data)
        sock.send(struct.pack("q", _fork_rank(request, fds, sock)))
        for fd in fds:
            os.close(fd)


def _fork_rank(request: dict, fds: list[int], sock: socket.socket) -> int:
    """Fork a child that forks the rank and ends at once, so the rank is re-parented to the
    agent (the subreaper); the rank's pid once that happened, or ``-errno``."""
    r, w = os.pipe()
    try:
        child = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        return -(e.errno or 1)
    if child == 0:
        os.close(r)
        try:
            rank = os.fork()
        except OSError as e:
            os.write(w, struct.pack("q", -(e.errno or 1)))
            os._exit(0)
        if rank == 0:
            os.close(w)
            sock.close()
            _run_rank(request, fds)  # never returns
        os.write(w, struct.pack("q", rank))
        os._exit(0)
    os.close(w)
    answer = os.read(r, 8)
    os.close(r)
    os.waitpid(child, 0)  # the rank is the agent's child from here
    return struct.unpack("q", answer)[0] if len(answer) == 8 else -1


def _run_rank(request: dict, fds: list[int]) -> None:
    """The rank: torchrun's process set up as ``Popen(args, env, stdout, stderr,
    start_new_session=True)`` would have it, then ``args``' module as ``__main__`` (``python
    -u -m MODULE ARGS``); ends the process with its exit code."""
    code = 1
    try:
        os.setsid()
        agent = request["agent"]
        deadline = time.monotonic() + REPARENT_S
        while os.getppid() != agent:
            if time.monotonic() > deadline:
                os._exit(1)
            time.sleep(0.0005)
        lifetime.die_with_parent(signal.SIGKILL, agent)
        fds = list(fds)
        if request["stdout"]:
            os.dup2(fds.pop(0), 1)
        if request["stderr"]:
            os.dup2(fds.pop(0), 2)
        keep = request["keep"]
        moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds[-len(keep):]] if keep else []
        for fd, number in zip(moved, keep):  # (out of the way of every number first)
            os.dup2(fd, number)
        for fd in _open_fds():
            if fd > 2 and fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                    signal.SIGUSR2, signal.SIGCHLD, signal.SIGALRM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        # ``python -u``: unbuffered, each write reaches the file at once
        for name in ("stdout", "stderr"):
            stream = io.TextIOWrapper(io.FileIO(1 if name == "stdout" else 2, "w",
                                                closefd=False),
                                      encoding="utf-8", errors="backslashreplace",
                                      write_through=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        args = request["args"]
        at = args.index("-m")
        sys.argv = [args[at + 1], *args[at + 2:]]
        try:
            runpy.run_module(args[at + 1], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _open_fds() -> list[int]:
    """This process's open descriptors (``/proc/self/fd``)."""
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd"))
    except OSError:
        return list(range(3, 256))
