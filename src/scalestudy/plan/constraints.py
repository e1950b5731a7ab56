"""The planner's verdict on a point: the shape rules (``scalestudy.config.layout_rules``,
which the trainer's engine checks too) and then the memory rule.

The planner skips a point with :func:`violation`'s sentence as its reason; the memory model
and ``tune`` use the same rules. Each rule returns a sentence with the numbers, or None.
Memory: the estimate of the most loaded device within 90% of its capacity (on CPU: the
node's memory shared by its processes, :func:`capacity_bytes`).
"""

from __future__ import annotations

from scalestudy.config.limits import CPU_PROCESS_BASELINE_BYTES
from scalestudy.config.layout_rules import RULES, Infeasible
from scalestudy.config.point import Point
from scalestudy.config.vocab import Device
from scalestudy.config import devices
from scalestudy.perf import memory

#: Fraction of a device's memory a point may plan to use (the rest: workspace, fragmentation).
MEMORY_HEADROOM = 0.9


def memory_fit(p: Point, capacity_bytes: float, known: dict | None = None) -> str | None:
    """The memory model's estimate (``known``: computed already) against
    ``MEMORY_HEADROOM`` of the device's capacity."""
    ok, reason = memory.fits(p, capacity_bytes, MEMORY_HEADROOM, known)
    return None if ok else reason


def violation(p: Point, capacity_bytes: float | None = None) -> str | None:
    """The first rule ``p`` breaks, as a sentence with the numbers; None when it can run.
    ``capacity_bytes``: the device memory to check the estimate against (None: no check)."""
    for rule in RULES:
        reason = rule(p)
        if reason:
            return reason
    if capacity_bytes:
        return memory_fit(p, capacity_bytes)
    return None


def capacity_bytes(platform, procs_per_node: int = 1) -> float | None:
    """Memory per device for the memory rule: ``platform.memory_per_device_gb``, else the
    hardware table's figure for ``platform.hardware``; on ``device: cpu`` (each process stands
    in for a device) the node's memory shared by its ``procs_per_node`` processes, less
    :data:`~scalestudy.config.limits.CPU_PROCESS_BASELINE_BYTES` each for the runtime: the
    node's memory is ``site.mem_per_proc_mb`` per process or ``site.mem_per_node_mb`` when the
    site states it (what the Slurm job asks for), else this host's (planning runs where the
    points run, or on a login node like them). Else None (no check)."""
    if platform.memory_per_device_gb:
        return float(platform.memory_per_device_gb) * 1e9
    if platform.hardware:
        gb = devices.memory_gb(platform.hardware)
        return None if gb is None else gb * 1e9
    if platform.device == Device.CPU:
        site = platform.site
        procs = max(1, int(procs_per_node))
        if site.mem_per_proc_mb:
            per_proc = site.mem_per_proc_mb * 2**20
        elif site.mem_per_node_mb:
            per_proc = site.mem_per_node_mb * 2**20 / procs
        else:
            per_proc = host_memory_bytes() / procs
        return max(per_proc - CPU_PROCESS_BASELINE_BYTES, 1e6)
    return None


def host_memory_bytes() -> float:
    """This host's memory: physical RAM, or less where a cgroup (container, Slurm job) caps
    it."""
    import os

    total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = float(text)
    return total


def check(p: Point, capacity_bytes: float | None = None) -> None:
    """Raise :class:`Infeasible` with :func:`violation`'s sentence."""
    reason = violation(p, capacity_bytes)
    if reason:
        raise Infeasible(reason)

