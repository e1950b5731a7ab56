"""The kernel's own word on a SIGKILL: whether its OOM killer ended a process of the point.

A process the kernel's OOM killer ends (a memory cgroup's limit, as Slurm's ``task/cgroup``
enforces ``--mem``, or the whole host out of memory) dies by SIGKILL and writes nothing, so
its log reads like any other kill. The kernel keeps count and says so:

- **the memory cgroup's counter** of the runner (its ranks share it): cgroup v2
  ``memory.events`` ``oom_kill`` (hierarchical: a kill in a child cgroup counts too), cgroup v1
  ``memory.oom_control`` ``oom_kill`` (kernel >= 4.13; the victim's own cgroup). Read before
  and after an attempt (:func:`snapshot`, :func:`oom_kills_since`): a count that grew means a
  process of this cgroup was OOM-killed meanwhile.
- **the kernel log** (``/dev/kmsg``, readable by root or with ``CAP_SYSLOG``): the killer's
  ``Killed process PID (comm)`` line (:func:`kernel_lines_since`).

Slurm's own word (``slurmstepd: error: Detected N oom_kill event(s)``, a job state
``OUT_OF_MEMORY``) is in the step's log and read there (``scalestudy.run.outcome``). Every
reader answers None or nothing where the host does not offer it; the decision is
:func:`scalestudy.run.outcome.kernel_oom`.
"""

from __future__ import annotations

import errno
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
KMSG = "/dev/kmsg"
#: The most kernel log records read per attempt (the ring buffer holds a few thousand).
MAX_RECORDS = 100_000


@dataclass(frozen=True)
class Snapshot:
    """The memory cgroup's OOM-kill counter (None: not readable here) and the clock (µs of
    CLOCK_MONOTONIC, the kernel log's) when an attempt started."""

    counter: Path | None
    oom_kills: int | None
    t_us: int


def memory_counter(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> Path | None:
    """The file that counts OOM kills in this process's memory cgroup (``proc_cgroup``: the
    text of ``/proc/self/cgroup``), or None."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            return None
    for line in proc_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        rel = path.lstrip("/")
        if "memory" in controllers.split(","):  # v1
            f = root / "memory" / rel / "memory.oom_control"
        elif hid == "0" and controllers == "":  # v2, mounted at the root or at unified/
            f = next((d / rel / "memory.events" for d in (root, root / "unified")
                      if (d / rel / "memory.events").is_file()), None)
        else:
            continue
        if f is not None and f.is_file():
            return f
    return None


def read_oom_kills(counter: Path | None) -> int | None:
    """The ``oom_kill`` count in ``counter`` (``memory.events`` or ``memory.oom_control``)."""
    if counter is None:
        return None
    try:
        text = counter.read_text()
    except OSError:
        return None
    m = re.search(r"^oom_kill (\d+)$", text, re.M)
    return int(m[1]) if m else None


def _now_us() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def snapshot() -> Snapshot:
    """The counter and the clock before an attempt."""
    counter = memory_counter()
    return Snapshot(counter, read_oom_kills(counter), _now_us())


def oom_kills_since(before: Snapshot) -> tuple[int, str] | None:
    """``(kills, "FILE: oom_kill A -> B")`` counted in the memory cgroup since ``before``, or
    None where the counter cannot be read."""
    after = read_oom_kills(before.counter)
    if before.oom_kills is None or after is None:
        return None
    return after - before.oom_kills, f"{before.counter}: oom_kill {before.oom_kills} -> {after}"


def kernel_lines_since(t_us: int, path: str = KMSG) -> list[str]:
    """The kernel log's messages logged at or after ``t_us`` (µs of CLOCK_MONOTONIC); none
    where the log is not readable (not root, no ``/dev/kmsg``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    out = []
    try:
        for _ in range(MAX_RECORDS):
            try:
                rec = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # a record overwritten while reading: go on
                    continue
                break  # EAGAIN: the end
            if not rec:
                break
            head, _, msg = rec.decode(errors="replace").partition(";")
            fields = head.split(",")
            if len(fields) >= 3 and fields[2].isdigit() and int(fields[2]) >= t_us:
                out.append(msg.splitlines()[0] if msg else "")
    finally:
        os.close(fd)
    return out
