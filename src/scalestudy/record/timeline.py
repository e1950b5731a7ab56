"""One rank's profiled steps read as the named terms of ``scalestudy.record.terms``: every
instant of a step is given to exactly one term (the interval reading).

**Host trace (a CPU run; gloo).** The step is the ``ProfilerStep#k`` range of the main
thread, from its first operator to its last (what the window holds before and after them, a
step hook's sleep or a data loader's Python, is not the step). Its operators nest in time; each instant belongs to the innermost one and is read by
the chain of operators around it:

- inside ``Optimizer.*`` or the trainer's ``scalestudy::clip_grad_norm`` scope: optimizer;
  inside ``scalestudy::data``: data;
- inside an attention operator (``scaled_dot_product``, flash / efficient / flex attention,
  forward or backward): attention; inside ``AccumulateGrad``: gradient accumulation;
- else the innermost operator that is not a view or an allocation: a matrix product
  (``mm``, ``addmm``, ``bmm``, ``linear``, ...) is a GEMM, any other ``aten::`` operator a
  memory-bound kernel, autograd's own wrappers and nodes their host time: framework overhead;
  any other framework scope (DDP's forward, FSDP's gathers, the pipeline schedule's
  ``Forward i`` / ``Backward i``, the trainer's ``scalestudy::*`` phases) running no operator
  of its own: framework overhead, or blocked while a transfer is in flight (a ``Work.wait()``
  records no event of its own);
- blocked: a collective's wait (``_c10d_functional::wait_tensor``), a launch, a scope as just
  said, or no operator at all while a transfer is in flight.
  A blocked instant is exposed communication of the transfer in flight that completes first
  (gloo records each collective's lifetime, launch to completion, as ``gloo:<op>``);
- outside every operator and scope with no transfer in flight: ``unattributed`` (the trace
  does not say what the host did: a training loop's own Python, the scheduler).

Before a piece of the step goes to its term, two charges are taken out of it (``_Charges``):
the time the training thread waited for a core inside it (``core_wait_s``: the run-queue
samples the built-in trainer writes beside its trace, linear between samples; the other
threads', which carry the transfers, count only while a transfer's bytes move, which the
pairing across ranks says: ``scalestudy.record.trace_terms``) and the
profiler's measured cost for each recorded event that starts in it (out of the step: the
step's ``raw_span_s`` keeps it, ``profiler_s`` says how much).

A transfer's kind comes from the op that launched it: the collective named by the host ops
around its launch (``record_param_comms``' ``Collective name``, ``nccl:all_to_all``,
``gloo:all_reduce``, ``c10d::alltoall_base_``, ``_c10d_functional::...``:
:func:`launcher_collective`), the kernel's name only where no launcher names one (NCCL runs
most collectives through ``SendRecv`` kernels; such a transfer says ``named_by: kernel
name``). Send/recv are pipeline (``pp``) traffic, and only they; a collective launched inside
an optimizer scope is the optimizer's; a process group naming its mesh dimension gives the
kind; inside an FSDP scope, or a plain ``c10d`` collective (DDP's reducer, ZeRO's
broadcasts), data parallel (``dp``); a functional collective (DTensor's) is tensor parallel
(``tp``), or context parallel (``cp``) inside attention or when the point has no tensor
parallelism. Computing while a transfer is in flight is that kind's overlapped time.

**Device trace (CUDA/ROCm).** The step is the host's ``ProfilerStep#k`` range; its kernels
are those launched inside it. Each instant of the step is read on the device: a computing
kernel (by the host operator that launched it, else by its name) makes the instant that
term; a communication kernel (``nccl``/``rccl`` in the name) alone makes it exposed
communication of its kind; a host-to-device copy alone is data, another copy or set alone a
memory-bound kernel (a copy does not hide a transfer); nothing running is the device idle,
the host not keeping it fed: framework overhead. ``StepReading.device`` regroups the terms as
HTA's temporal breakdown groups time (``record.hta``).

Exposed pipeline traffic is its transfers and the stage's waiting for the other stages (the
bubble); a collective's exposed time, its transfer and the waiting for the slowest rank. Both
splits need the other ranks' traces (``scalestudy.record.trace_terms``): here all of it is
the kind's exposed communication, and each transfer keeps its lifetime, exposed seconds and
the pieces in which the rank was blocked on it (:class:`Transfer`); each step its window and
the rank's run-queue waits (``StepReading.core``), which the replay across ranks reads
(``scalestudy.record.replay``).

Pure: no torch, no files.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

from scalestudy.config import trace_scopes
from scalestudy.record.kernels import (BY_KERNEL_NAME, BY_LAUNCHER, COMM_KERNEL, GEMM_KERNEL,
                                       P2P_COLLECTIVES, collective_of, launcher_collective)
from scalestudy.record.terms import COMM_TERM, MEASURED_TERMS, OVERLAP_TERM
from scalestudy.record.trace import LAUNCH_CATEGORIES, Event, Trace


_ATTENTION = re.compile(r"scaled_dot_product|flash_attention|efficient_attention|"
                        r"FlashAttention|EfficientAttention|cudnn_attention|flex_attention|"
                        r"ScaledDotProduct|fmha|_attention_forward|_attention_backward")
_GEMM = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm|addmv|mv|"
                   r"_int_mm|_addmm_activation)$")
_NEUTRAL = re.compile(r"^aten::(empty|empty_strided|empty_like|resize_|as_strided|view|"
                      r"reshape|_reshape_alias|t|transpose|permute|expand|unsqueeze|squeeze|"
                      r"select|slice|detach|detach_|alias|_unsafe_view|unflatten|flatten|"
                      r"split|split_with_sizes|chunk|narrow|lift_fresh|unbind|set_|"
                      r"result_type|is_nonzero|item|_local_scalar_dense|resolve_conj|"
                      r"resolve_neg|view_as|expand_as|contiguous|to|_to_copy_noop)$")
_WAIT = re.compile(r"wait_tensor|^c10d::wait|ProcessGroup.*::wait|^aten::wait")
_LAUNCH = re.compile(r"^(c10d::|_c10d_functional::|c10d_functional::|record_param_comms)")
_P2P = re.compile(r"send|recv|SendRecv", re.IGNORECASE)
#: autograd's own scopes (its engine's wrappers and the graph's nodes, ``AddmmBackward0``):
#: their time between operators is the backward's host work, never a wait.
_AUTOGRAD = re.compile(r"^autograd::|^torch::autograd::|Backward\d*$")

# instant kinds of the host timeline (besides the compute terms)
BLOCKED, GAP, SCOPE = "blocked", "gap", "scope"


@dataclass(frozen=True)
class _Flags:
    optimizer: bool
    data: bool
    attention: bool
    accumulate: bool
    gemm: bool
    neutral: bool
    aten: bool
    wait: bool
    launch: bool
    fsdp: bool
    autograd: bool


@lru_cache(maxsize=None)
def _flags(name: str) -> _Flags:
    return _Flags(optimizer=name.startswith("Optimizer.") or name == trace_scopes.CLIP,
                  data=name == trace_scopes.DATA, attention=bool(_ATTENTION.search(name)),
                  accumulate="AccumulateGrad" in name, gemm=bool(_GEMM.match(name)),
                  neutral=bool(_NEUTRAL.match(name)), aten=name.startswith("aten::"),
                  wait=bool(_WAIT.search(name)), launch=bool(_LAUNCH.match(name)),
                  fsdp=name.startswith("FSDP::"),
                  autograd=bool(_AUTOGRAD.search(name)))


@lru_cache(maxsize=65536)
def classify_chain(names: tuple[str, ...]) -> str:
    """What an instant is, from the names of the host operators around it (outermost first):
    a term name of ``MEASURED_TERMS``, or ``blocked`` (waiting on a transfer), ``scope`` (a
    framework scope's own time: blocked when a transfer is in flight, else overhead) or
    ``gap`` (no operator)."""
    if not names:
        return GAP
    flags = [_flags(n) for n in names]
    if any(f.optimizer for f in flags):
        return "optimizer_s"
    if any(f.data for f in flags):
        return "data_s"
    inner = flags[-1]
    if inner.wait or inner.launch:
        return BLOCKED
    if any(f.attention for f in flags):
        return "attention_s"
    if any(f.accumulate for f in flags):
        return "grad_accum_s"
    for f in reversed(flags):
        if f.neutral:
            continue
        if f.gemm:
            return "gemm_s"
        if f.aten:
            return "elementwise_s"
        return "overhead_s" if f.autograd else SCOPE
    return "elementwise_s"


@dataclass
class Transfer:
    """One communication of a step on one rank: its ``kind`` (tp, dp, pp, cp, or optimizer),
    ``op`` (e.g. ``gloo:all_reduce``, an NCCL kernel's name) and ``index`` (the how-manieth of
    that kind and op in the step: the key that pairs it across ranks), its lifetime (s) and
    the seconds of it the rank was blocked on (``exposed``) or computed through
    (``overlapped``)."""

    kind: str
    op: str
    index: int
    start: float
    end: float
    exposed: float = 0.0
    overlapped: float = 0.0
    collective: str | None = None
    named_by: str = BY_LAUNCHER
    #: the pieces of the step (s, the trace's clock) in which the rank was blocked on it
    blocked: list[tuple[float, float]] = field(default_factory=list)
    waited: float = 0.0  # s of it the rank waited for another rank (sync wait or bubble)

    @property
    def lifetime(self) -> float:
        return self.end - self.start


@dataclass
class StepReading:
    """One profiled step of one rank: ``span_s`` its length (s), ``terms`` seconds per
    ``MEASURED_TERMS`` name adding up to ``span_s`` (``sync_wait_s`` still 0: see
    ``scalestudy.record.trace_terms``), ``overlapped`` seconds per kind, ``transfers`` its
    communications, ``events`` the host events the profiler recorded in it; ``raw_span_s``
    the traced length before the profiler's cost was taken out, ``profiler_s`` that cost
    (``span_s = raw_span_s - profiler_s``); on a device trace ``device``, the terms regrouped
    as HTA's temporal breakdown groups time (seconds): ``compute_s`` (a computing kernel ran),
    ``non_compute_s`` (only transfers, copies or sets: the exposed communication, the
    optimizer's included, and the memory kernels), ``idle_s`` (``overhead_s``) and
    ``kernels``, the first kernel's start and the last one's end (s)."""

    step: str
    span_s: float
    terms: dict[str, float]
    overlapped: dict[str, float]
    transfers: list[Transfer] = field(default_factory=list)
    events: int = 0
    raw_span_s: float = 0.0
    profiler_s: float = 0.0
    device: dict | None = None
    #: the rank's training thread's wait for a core (None: no samples), and the wall clock
    #: (ns) at the trace's time 0: a peer's wait is read at the same instants
    core: CoreWaits | None = None
    clock_ns: int = 0
    window: tuple[float, float] = (0.0, 0.0)  # the step, first operator to last (trace clock)
    #: the starts of its recorded events (trace clock) and the profiler's cost of each (s)
    event_starts: list[float] = field(default_factory=list)
    event_cost_s: float = 0.0


def _segments(events: list[Event], s0: float, s1: float):
    """``(start, end, chain, innermost)`` pieces covering ``[s0, s1]``: each instant with the
    names of the (properly nested) events around it, outermost first, and the innermost event
    (None: none); a child running past its parent is cut at the parent's end."""
    out, stack, cursor = [], [], s0

    def emit(upto: float) -> None:
        nonlocal cursor
        if upto > cursor:
            out.append((cursor, upto, tuple(e.name for e, _ in stack),
                        stack[-1][0] if stack else None))
            cursor = upto

    for e in events:
        st, en = max(e.start, s0), min(e.end, s1)
        while stack and stack[-1][1] <= st:
            emit(stack[-1][1])
            stack.pop()
        emit(st)
        if stack:
            en = min(en, stack[-1][1])
        if en > st:
            stack.append((e, en))
    while stack:
        emit(stack[-1][1])
        stack.pop()
    emit(s1)
    return out


def transfer_kind(launch_chain: tuple[str, ...], op: str, layout: dict,
                  group_desc: str | None = None, collective: str | None = None) -> str:
    """The kind of a transfer (module doc) from the host operators around its launch
    (outermost first), its own name, the point's ``layout`` (``tp``, ``cp`` counts), where
    the trace names it its process group's description (``mesh_tp``, ``mesh_dp``, ...), and
    the collective its launcher names (:func:`launcher_collective`): pipeline traffic only
    from send/recv; the kernel's name counts only where no launcher names the collective."""
    if any(_flags(n).optimizer for n in launch_chain):
        return "optimizer"
    if group_desc:
        for kind in ("tp", "pp", "cp", "dp"):
            if re.search(rf"(^|[_:]){kind}([_:]|$)", group_desc):
                return kind
        if re.search(r"fsdp|shard|replicate", group_desc):
            return "dp"
    names = launch_chain + (op,)
    if collective is not None:
        if collective in P2P_COLLECTIVES:
            return "pp"
    elif any(_P2P.search(n) for n in names):
        return "pp"
    if any(_flags(n).fsdp for n in launch_chain):
        return "dp"
    functional = any("_c10d_functional" in n or "c10d_functional" in n for n in names)
    if functional:
        if layout.get("cp", 1) > 1 and (layout.get("tp", 1) == 1
                                        or any(_flags(n).attention for n in launch_chain)):
            return "cp"
        return "tp" if layout.get("tp", 1) > 1 else "dp"
    return "dp"


def _nested(events: list[Event], pushed: Callable[[Event], bool] = lambda e: True):
    """Each event with the events around it on its thread, outermost first: ``(event,
    stack)``, the stack valid until the next item; ``pushed(e)``: whether ``e`` can enclose
    those after it."""
    by_tid: dict = {}
    for e in events:
        by_tid.setdefault(e.tid, []).append(e)
    for evs in by_tid.values():
        stack: list[Event] = []
        for e in evs:
            while stack and stack[-1].end <= e.start:
                stack.pop()
            yield e, stack
            if pushed(e) and (not stack or e.end <= stack[-1].end):
                stack.append(e)


def _host_chains(events: list[Event]) -> dict:
    """For each host event: the names of the events around it on its thread (outermost
    first), by ``id(event)``."""
    return {id(e): tuple(x.name for x in stack) for e, stack in _nested(events)}


def _owner(op: Event | None, live: list[Transfer], starts: list[float]) -> Transfer | None:
    """The transfer a blocked operator with none in flight is about: a launch's, the first
    to start after the launch began (gloo's send may block in its launch until the peer is
    there); a wait's, the last one started before it."""
    if op is None:
        return None
    if _flags(op.name).wait:
        i = bisect_right(starts, op.start) - 1
        return live[i] if i >= 0 else None
    i = bisect_right(starts, op.start)
    return live[i] if i < len(live) else (live[-1] if live else None)


def _attribute(kind: str, seconds: float, terms: dict) -> None:
    terms["optimizer_s" if kind == "optimizer" else COMM_TERM[kind]] += seconds


def _blocked_pieces(a: float, b: float, live: list[Transfer]):
    """``[a, b]`` cut where transfers in flight end: each piece with the transfer in flight
    that completes first (None where none is in flight)."""
    t = a
    while t < b:
        flying = [x for x in live if x.start <= t < x.end]
        if not flying:
            nxt = min([x.start for x in live if x.start > t] + [b])
            yield t, nxt, None
            t = nxt
            continue
        first = min(flying, key=lambda x: x.end)
        nxt = min(first.end, b)
        yield t, nxt, first
        t = nxt


def _empty_terms() -> dict:
    return dict.fromkeys(MEASURED_TERMS, 0.0)


class CoreWaits:
    """A rank's cumulative run-queue waits (:func:`runqueue_samples` of its trace), linear
    between samples: the training thread's, and its other threads' (the backend's)."""

    def __init__(self, samples: list[tuple]):
        self.t = [x[0] for x in samples]
        self.w = [x[1] for x in samples]
        self.o = [x[1] + (x[2] if len(x) > 2 else 0.0) for x in samples]

    def __bool__(self) -> bool:
        return bool(self.t)

    def at(self, x: float, others: bool = False) -> float:
        """The cumulative wait at ``x`` (s, the trace's clock): the training thread's, plus
        the other threads' where ``others``."""
        w = self.o if others else self.w
        i = bisect_right(self.t, x)
        if i == 0 or i == len(self.t):
            return w[0] if i == 0 else w[-1]
        t0, t1, w0, w1 = self.t[i - 1], self.t[i], w[i - 1], w[i]
        return w0 + (w1 - w0) * (x - t0) / (t1 - t0) if t1 > t0 else w1

    def between(self, x: float, y: float, others: bool = False) -> float:
        """The wait for a core in ``[x, y]`` (s), at most ``y - x``; 0 without samples."""
        if not self.t or y <= x:
            return 0.0
        return min(y - x, max(0.0, self.at(y, others) - self.at(x, others)))


class _Charges:
    """What a host step's pieces of time are charged before their term gets the rest: the
    time the training thread waited for a core inside them (``core_wait_s``, from the
    run-queue samples) and the profiler's cost of the events that start in them
    (``event_cost_s`` each); never more than the piece holds (what a piece cannot hold of
    the profiler's cost, the pieces after it pay). While the training thread is blocked on
    a transfer it waits for no core; the other threads' waits then hold up the transfer only
    while its bytes move, which the pairing across ranks reads
    (``scalestudy.record.trace_terms``)."""

    def __init__(self, core: CoreWaits, starts: list[float], event_cost_s: float):
        self.core, self.starts, self.cost = core, starts, event_cost_s
        self.profiler = self.owed = 0.0

    def take(self, x: float, y: float, terms: dict) -> float:
        """Charge ``[x, y]``: its core wait to ``core_wait_s`` and its events' profiler cost
        out of the step; the seconds left for the piece's own term."""
        length = y - x
        wait = self.core.between(x, y)
        terms["core_wait_s"] += wait
        n = bisect_left(self.starts, y) - bisect_left(self.starts, x) if self.cost else 0
        owed = self.owed + n * self.cost
        cost = min(length - wait, owed)
        self.owed = owed - cost  # (a piece shorter than its events' cost: the next pays)
        self.profiler += cost
        return length - wait - cost


def read_host_step(trace: Trace, step: Event, layout: dict, event_cost_s: float = 0.0,
                   samples: list[tuple] | None = None) -> StepReading:
    """One profiled step of a host (CPU) trace as its terms (module doc); ``event_cost_s``:
    the profiler's cost per recorded event on this host (s), taken out where each event
    starts; ``samples``: :func:`runqueue_samples` of the trace (computed when None)."""
    s0, s1 = step.start, step.end
    main, lifetimes = [], []
    for e in trace.host:
        if e.end <= s0 or e.start >= s1:
            continue
        if e.name.startswith("gloo:"):
            if e.start >= s0:  # (one launched in an earlier step ends there)
                lifetimes.append(e)
        elif e.tid == trace.main_tid:
            main.append(e)
    if main:  # the step: its first operator to its last (the window's idle ends are not it)
        s0, s1 = max(s0, min(e.start for e in main)), min(s1, max(e.end for e in main))
    chains = _host_chains(main)
    launches = [e for e in main if _flags(e.name).launch and not _flags(e.name).wait]
    starts = [e.start for e in launches]
    transfers, counts = [], {}
    for lt in sorted(lifetimes, key=lambda e: e.start):
        i = bisect_right(starts, lt.start + 1e-6) - 1
        chain = (chains[id(launches[i])] + (launches[i].name,)) if i >= 0 else ()
        coll = collective_of(lt.name) or launcher_collective(chain)
        kind = transfer_kind(chain, lt.name, layout, collective=coll)
        key = (kind, lt.name)
        counts[key] = counts.get(key, -1) + 1
        transfers.append(Transfer(kind, lt.name, counts[key], max(lt.start, s0),
                                  min(lt.end, s1), collective=coll))
    terms = _empty_terms()
    live = sorted(transfers, key=lambda t: t.start)
    live_starts = [t.start for t in live]
    core = CoreWaits(samples or [])
    charge = _Charges(core, sorted(e.start for e in main), event_cost_s)
    for a, b, names, inner in _segments(main, s0, s1):
        what = classify_chain(names)
        if what in (BLOCKED, GAP, SCOPE):
            for x, y, t in _blocked_pieces(a, b, live):
                if t is None and what == BLOCKED:  # a launch or a wait with none in flight
                    t = _owner(inner, live, live_starts)
                left = charge.take(x, y, terms)
                if t is not None:
                    t.exposed += left
                    t.blocked.append((x, y))
                    _attribute(t.kind, left, terms)
                else:
                    terms["overhead_s" if what == SCOPE else "unattributed_s"] += left
            continue
        terms[what] += charge.take(a, b, terms)
        for t in live:
            if t.start < b and t.end > a and t.kind != "optimizer":
                t.overlapped += min(b, t.end) - max(a, t.start)
    overlapped = {k: sum(t.overlapped for t in transfers if t.kind == k)
                  for k in OVERLAP_TERM}
    return StepReading(step.name, s1 - s0 - charge.profiler, terms, overlapped, transfers,
                       events=len(main) + len(lifetimes), raw_span_s=s1 - s0,
                       profiler_s=charge.profiler, core=core if core else None,
                       clock_ns=trace.base_ns, window=(s0, s1),
                       event_starts=charge.starts, event_cost_s=event_cost_s)


def _kernel_term(chain: tuple[str, ...], name: str) -> str:
    what = classify_chain(chain) if chain else GAP
    if what not in (BLOCKED, GAP, SCOPE, "overhead_s"):
        return what
    if _ATTENTION.search(name):
        return "attention_s"
    if GEMM_KERNEL.search(name):
        return "gemm_s"
    return "elementwise_s"


def _group_desc(trace: Trace, chain_events: list[Event]) -> str | None:
    names = {str(g.get("pg_name")): str(g.get("pg_desc") or "") for g in trace.groups}
    for e in reversed(chain_events):
        args = e.args or {}
        desc = args.get("Process Group Description") or names.get(
            str(args.get("Process Group Name")))
        if desc:
            return str(desc)
    return None


def read_device_step(trace: Trace, step: Event, layout: dict,
                     chains: dict | None = None) -> StepReading:
    """One profiled step of a device (GPU) trace as its terms (module doc). ``chains``: the
    host chains of the trace's launches (``launch_chains``), computed once per trace."""
    chains = launch_chains(trace) if chains is None else chains
    s0, s1 = step.start, step.end
    main = [e for e in trace.host if e.tid == trace.main_tid and s0 <= e.start < s1]
    if main:  # (as on a host trace: the window's first operator to its last)
        s0, s1 = max(s0, main[0].start), min(s1, max(e.end for e in main))
    kernels = []  # (start, end, term or "comm", transfer or None)
    transfers, counts = [], {}
    for k in trace.gpu:
        launch = trace.launches.get((k.args or {}).get("correlation"))
        inside = (s0 <= launch.start < s1) if launch is not None else (k.start < s1 and k.end > s0)
        if not inside:
            continue
        names, around = chains.get(id(launch), ((), [])) if launch is not None else ((), [])
        if k.cat == "gpu_memcpy" and "HtoD" in k.name:
            kernels.append((k.start, k.end, "data_s", None))
        elif COMM_KERNEL.search(k.name):
            coll = launcher_collective(names, around)
            by = BY_LAUNCHER if coll else BY_KERNEL_NAME
            coll = coll or collective_of(k.name)
            kind = transfer_kind(names, k.name, layout, _group_desc(trace, around),
                                 coll if by == BY_LAUNCHER else None)
            op = coll if by == BY_LAUNCHER else k.name
            key = (kind, op)
            counts[key] = counts.get(key, -1) + 1
            t = Transfer(kind, op, counts[key], k.start, k.end, collective=coll, named_by=by)
            transfers.append(t)
            kernels.append((k.start, k.end, "comm", t))
        elif k.cat in ("gpu_memcpy", "gpu_memset"):  # (a copy does not hide a transfer)
            kernels.append((k.start, k.end, "memory", None))
        else:
            kernels.append((k.start, k.end, _kernel_term(names, k.name), None))
    terms = _empty_terms()
    memory = opt_comm = 0.0
    end = max([s1] + [k[1] for k in kernels])
    cuts = sorted({s0, end, *(max(k[0], s0) for k in kernels), *(min(k[1], end) for k in kernels)})
    kernels.sort(key=lambda k: k[0])
    active, nxt = [], 0
    for a, b in zip(cuts, cuts[1:]):
        while nxt < len(kernels) and kernels[nxt][0] < b:
            active.append(kernels[nxt])
            nxt += 1
        active = [k for k in active if k[1] > a]
        on = [k for k in active if k[0] < b]
        compute = [k for k in on if k[2] not in ("comm", "data_s", "memory")]
        comms = [k[3] for k in on if k[2] == "comm"]
        if compute:
            terms[compute[0][2]] += b - a
            for t in comms:
                if t.kind != "optimizer":
                    t.overlapped += b - a
        elif comms:
            t = min(comms, key=lambda x: x.end)
            t.exposed += b - a
            _attribute(t.kind, b - a, terms)
            opt_comm += (b - a) if t.kind == "optimizer" else 0.0
        elif any(k[2] == "memory" for k in on):  # a device copy or set: memory-bound
            terms["elementwise_s"] += b - a
            memory += b - a
        elif any(k[2] == "data_s" for k in on):
            terms["data_s"] += b - a
        else:
            terms["overhead_s"] += b - a  # the device idle: the host did not keep it fed
    overlapped = {k: sum(t.overlapped for t in transfers if t.kind == k) for k in OVERLAP_TERM}
    idle, busy = terms["overhead_s"], end - s0 - terms["overhead_s"]
    non_compute = (sum(terms[COMM_TERM[k]] for k in COMM_TERM) + opt_comm + memory
                   + terms["data_s"])
    return StepReading(step.name, end - s0, terms, overlapped, transfers,
                       events=sum(1 for e in trace.host if s0 <= e.start < s1),
                       raw_span_s=end - s0,
                       device={"compute_s": busy - non_compute, "non_compute_s": non_compute,
                               "idle_s": idle,
                               "kernels": (min((k[0] for k in kernels), default=s0),
                                           max((k[1] for k in kernels), default=s0))})


def launch_chains(trace: Trace) -> dict:
    """``id(launch event) -> (names, events)`` of the host events around each kernel launch of
    a device trace (outermost first)."""
    def launch(e: Event) -> bool:
        return e.cat in LAUNCH_CATEGORIES

    return {id(e): (tuple(x.name for x in stack), list(stack))
            for e, stack in _nested(trace.host, lambda e: not launch(e)) if launch(e)}


def read_trace_steps(trace: Trace, layout: dict, event_cost_s: float = 0.0,
                     samples: list[tuple] | None = None) -> list[StepReading]:
    """Every profiled step of ``trace`` (host or device reading, module doc); ``layout``: the
    point's ``tp``, ``cp`` (and ``dp``, ``pp``) counts; ``event_cost_s``: the profiler's cost
    per recorded host event and ``samples`` the run-queue samples (:func:`read_host_step`),
    both taken out of a host step only (a device step is read on the device's clock)."""
    if trace.on_gpu:
        chains = launch_chains(trace)
        return [read_device_step(trace, s, layout, chains) for s in trace.steps]
    return [read_host_step(trace, s, layout, event_cost_s, samples) for s in trace.steps]


