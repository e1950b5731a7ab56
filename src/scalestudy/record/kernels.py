"""What a trace's names say about communication and the device: the collective a host op or a
kernel names (``all_to_all``, ``all_gather``, ``reduce_scatter``, ``all_reduce``, ``send``,
...), which kernels are communication (NCCL's and RCCL's, ``ncclKernel_*`` and
``ncclDevKernel_*``) or GEMMs (cuBLAS, CUTLASS, ROCm's Tensile ``Cijk_``), and a device
trace's whole timeline as HTA's temporal breakdown defines it (:func:`device_temporal`).
Pure: no torch, no files."""

from __future__ import annotations

import re
from functools import lru_cache

from scalestudy.record.trace import Event, Trace

COMM_KERNEL = re.compile(r"nccl|rccl", re.IGNORECASE)
# (cuBLAS/CUTLASS names; ``Cijk_`` is rocBLAS/hipBLASLt's Tensile GEMMs on ROCm)
GEMM_KERNEL = re.compile(r"gemm|cutlass|cublas|xmma|wgmma|Kernel2|matmul|_mm_|^Cijk_",
                          re.IGNORECASE)
#: A host event that names the collective it launches: the backend's own range
#: (``nccl:all_to_all``, ``gloo:all_reduce``), a c10d operator (``c10d::alltoall_base_``) or a
#: functional one (``_c10d_functional::all_gather_into_tensor``).
_COLLECTIVE_EVENT = re.compile(r"^(nccl|rccl|gloo|c10d|_c10d_functional|c10d_functional)::?"
                               r"(?P<op>\w+)")
#: Collectives by the words of their names (underscores dropped, lower case), most specific
#: first; ``send``/``recv`` are the only point-to-point ones.
_COLLECTIVES = (("alltoall", "all_to_all"), ("allgather", "all_gather"),
                ("reducescatter", "reduce_scatter"), ("allreduce", "all_reduce"),
                ("broadcast", "broadcast"), ("barrier", "barrier"), ("sendrecv", "send_recv"),
                ("send", "send"), ("recv", "recv"), ("gather", "gather"),
                ("scatter", "scatter"), ("reduce", "reduce"))
#: Collectives that are point-to-point traffic (a pipeline's, on the built-in trainer).
P2P_COLLECTIVES = ("send", "recv", "send_recv")
#: How a transfer's collective was found: from the host op that launched it, or (no launcher
#: in the trace) from the kernel's name only.
BY_LAUNCHER, BY_KERNEL_NAME = "launcher", "kernel name"


@lru_cache(maxsize=4096)
def collective_of(name: str) -> str | None:
    """The collective a name says (``all_to_all``, ``all_gather``, ``reduce_scatter``,
    ``all_reduce``, ``broadcast``, ``send``, ``recv``, ...), or None: a launcher's
    (``nccl:_all_gather_base``, ``c10d::alltoall_base_``, ``record_param_comms``' ``Collective
    name`` ``allreduce``) or a kernel's (``ncclDevKernel_AllGather_RING_LL``; NCCL runs many
    collectives through ``SendRecv`` kernels, so a kernel's name is the last resort)."""
    m = _COLLECTIVE_EVENT.match(name)
    words = (m.group("op") if m else name).replace("_", "").lower()
    if m is None:  # a kernel's name: the word after the library's kernel prefix
        k = re.match(r"^(?:void )?(?:nccl|rccl)(?:Dev)?Kernel_?(\w+)", name, re.IGNORECASE)
        if k is None:
            return None
        words = k.group(1).replace("_", "").lower()
    if words.startswith(("wait", "work")):
        return None
    for word, coll in _COLLECTIVES:
        if words.startswith(word):
            return coll
    return None


def launcher_collective(chain: tuple[str, ...], events: list[Event] = ()) -> str | None:
    """The collective named by the host ops around a launch (innermost first wins):
    ``record_param_comms``' ``Collective name`` argument, else an op's own name
    (:func:`collective_of`); None where no launcher says."""
    for e in reversed(list(events)):
        named = (e.args or {}).get("Collective name")
        if isinstance(named, str) and collective_of(f"c10d::{named}"):
            return collective_of(f"c10d::{named}")
    for n in reversed(chain):
        if _COLLECTIVE_EVENT.match(n):
            c = collective_of(n)
            if c:
                return c
    return None


def device_temporal(trace: Trace) -> dict:
    """A device trace's whole timeline as HTA's temporal breakdown defines it (seconds): from
    the first kernel's start to the last one's end, ``idle`` (no kernel), ``compute`` (the
    merged computing kernels) and ``non_compute`` (the rest: communication and memory
    kernels not under a computing one); ``comm_overlap``: the fraction of the merged
    communication kernels' time under a computing kernel."""
    ks = [(k.start, k.end, _kind_of_kernel(k)) for k in trace.gpu]
    if not ks:
        return {}
    span = max(k[1] for k in ks) - min(k[0] for k in ks)
    busy = _merged_length([(a, b) for a, b, _ in ks])
    comp = _merge([(a, b) for a, b, c in ks if c == "compute"])
    comm = _merge([(a, b) for a, b, c in ks if c == "comm"])
    overlap = _intersection(comm, comp)
    comm_len = sum(b - a for a, b in comm)
    compute = sum(b - a for a, b in comp)
    return {"span_s": span, "idle_s": span - busy, "compute_s": compute,
            "non_compute_s": busy - compute,
            "comm_overlap": overlap / comm_len if comm_len > 0 else None}


def _kind_of_kernel(k: Event) -> str:
    if COMM_KERNEL.search(k.name):
        return "comm"
    if k.cat in ("gpu_memcpy", "gpu_memset") or k.name.startswith(("Memcpy", "Memset")):
        return "memory"
    return "compute"


def _merge(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _intersection(p: list[tuple[float, float]], q: list[tuple[float, float]]) -> float:
    """The length common to two sorted lists of disjoint intervals."""
    i = j = 0
    total = 0.0
    while i < len(p) and j < len(q):
        total += max(0.0, min(p[i][1], q[j][1]) - max(p[i][0], q[j][0]))
        if p[i][1] < q[j][1]:
            i += 1
        else:
            j += 1
    return total


def _merged_length(iv: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _merge(iv))
