"""Process lifetime: every process a point starts ends with the launcher that started it.

The contract (docs/failures.md, "Process lifetime"), built from what Linux offers, without
polling:

- **Each level dies with its parent** (``PR_SET_PDEATHSIG``, :func:`dies_with_parent`): the
  runner with the Snakemake job that started it (``scalestudy run`` → Snakemake → runner), the
  launch (torchrun, ``srun``, the emulated nodes) with the runner, each rank with torchrun
  (``scalestudy.run.torchrun``). The signal is SIGTERM where the process cleans up on it
  (Snakemake cancels its jobs, the runner stops its launch, torchrun stops its ranks' groups,
  ``srun`` cancels its step and Slurm cleans it up), SIGKILL for a rank, which holds nothing to
  clean.
- **A cluster job's Snakemake dies with its parent too** (:func:`as_cluster_job`): the
  Snakemake of a Slurm job's batch script, or of its job step, gets SIGKILL when the process
  that started it (the batch script's shell, slurmstepd) ends; nothing else would end it
  where Slurm tracks a step by its parent-pid tree (``proctrack/linuxproc``).
- **Orphans come back to the runner** (``PR_SET_CHILD_SUBREAPER``, :func:`become_subreaper`): a
  process whose parent died (a command workload's background child, a rank of a killed
  torchrun) is re-parented to the runner instead of init, and :func:`end_orphans` kills them
  when the attempt ends, however it ended.
- **One training per point folder** (:func:`hold_point`): the runner takes
  ``RUN_DIR/.point.lock`` (``flock``) before it touches the folder and its launch inherits the
  descriptor down to the ranks (:data:`POINT_LOCK_FD_ENV`), so the lock is free only when the
  last process of the previous training is gone; a rerun waits for that, bounded.

Elsewhere than Linux the calls are no-ops (the process groups and the watchdog remain).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import sys
import time
from pathlib import Path

#: ``prctl`` options (linux/prctl.h).
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: The point folder's lock file, held by the runner and inherited by its launch.
POINT_LOCK = ".point.lock"
#: The inherited descriptor of the point's lock (a number), for torchrun to pass to its ranks.
POINT_LOCK_FD_ENV = "SCALESTUDY_POINT_LOCK_FD"
#: How long a runner waits for a previous training of its point to end (s): torchrun gives
#: its ranks 30 s between SIGTERM and SIGKILL.
POINT_LOCK_WAIT_S = 60.0


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return fn


#: libc's prctl, resolved once, before any fork (a ``preexec_fn`` must not load libraries).
_PRCTL = _load_prctl()


def prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)``; False where there is no prctl (not Linux) or it failed."""
    return _PRCTL is not None and _PRCTL(option, arg, 0, 0, 0) == 0


def die_with_parent(sig: int, parent: int) -> None:
    """Ask for ``sig`` when the parent thread ends; if ``parent`` (its pid when it started us)
    is gone already, take ``sig`` now (the race between fork and prctl)."""
    if prctl(PR_SET_PDEATHSIG, int(sig)) and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def dies_with_parent(sig: int = signal.SIGTERM, then=None):
    """A ``preexec_fn`` for ``subprocess.Popen``: the child gets ``sig`` when this process's
    starting thread ends, killed or not; ``then`` (another preexec_fn, or None) runs after."""
    parent = os.getpid()

    def preexec():
        die_with_parent(sig, parent)
        if then is not None:
            then()
    return preexec


def as_cluster_job() -> None:
    """What a Snakemake running as a cluster job (``--mode remote``) is: it gets SIGKILL when
    the process that started it ends. That parent (a Slurm batch script's shell, slurmstepd)
    ends before it only when the job is being ended (cancelled, its node set DOWN, its time
    limit), and Snakemake's own SIGTERM handling can then wait forever; re-parented to init, it
    escapes ``proctrack/linuxproc``, which signals the step's parent-pid tree. Armed when the
    Snakefile is parsed: a job ended before that is Slurm's process tracking alone."""
    die_with_parent(signal.SIGKILL, os.getppid())


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False elsewhere."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def children(pid: int | None = None) -> set[int]:
    """The pids whose parent is ``pid`` (default: this process), from ``/proc``."""
    pid = os.getpid() if pid is None else pid
    out = set()
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) "
        if len(fields) > 1 and int(fields[1]) == pid:
            out.add(int(name))
    return out


def end_orphans(keep: set[int] = frozenset(), rounds: int = 50) -> list[int]:
    """SIGKILL and reap this process's children except ``keep``, round after round (a killed
    orphan's own children come back to a subreaper); returns the pids ended."""
    ended = []
    for _ in range(rounds):
        left = children() - set(keep)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except ChildProcessError:  # not ours to reap (no subreaper): gone or init's
                pass
            except ProcessLookupError:
                continue
            ended.append(pid)
    return ended


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal the process group ``pgid``; False when it has no member left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return False


class PointBusy(RuntimeError):
    """Another training still holds the point's folder (one line)."""


def try_lock(path: str | os.PathLike, inheritable: bool = False) -> int | None:
    """An exclusive, non-blocking ``flock`` on ``path`` (created, never through a symlink): its
    descriptor, or None when another process holds it. The kernel drops the lock when the
    last process holding the descriptor ends, however it ends."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return None
    os.set_inheritable(fd, inheritable)
    return fd


def hold_point(run_dir: str | os.PathLike, wait_s: float | None = None) -> int:
    """Take the point folder's lock, waiting up to ``wait_s`` (default
    :data:`POINT_LOCK_WAIT_S`) for a previous training's last process to end; returns the
    descriptor (pass it to the launch). Raises :class:`PointBusy`."""
    wait_s = POINT_LOCK_WAIT_S if wait_s is None else wait_s
    path = Path(run_dir) / POINT_LOCK
    deadline = time.monotonic() + wait_s
    while (fd := try_lock(path, inheritable=True)) is None:
        if time.monotonic() >= deadline:
            raise PointBusy(f"{run_dir}: another training of this point is still running (its "
                            f"processes hold {path} after {wait_s:.0f} s); end them (fuser -k "
                            f"{path}) and rerun")
        time.sleep(0.25)
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()}\n".encode())
    return fd
