"""The one reader of a profiler trace: a rank's Kineto JSON (``torch.profiler``'s
``export_chrome_trace``, gzip or plain), as the built-in trainer writes it into
``runs/<id>/traces/`` and as a foreign trainer's profiler writes it (torchtitan's
``--profiling.enable_profiling``, Megatron's ``--use-pytorch-profiler``).

What it keeps (times in seconds from the trace's own clock; Kineto writes microseconds):

- the profiled steps: the ``ProfilerStep#k`` ranges ``torch.profiler.profile.step()`` marks,
  on the host thread that ran them (the *main* thread);
- the host's events (``ph: X``): operators, framework scopes, and the lifetimes of
  collectives (gloo records a ``gloo:<op>`` range from a collective's launch to its
  completion, on the thread that ran it);
- on a GPU trace, the device's kernels, copies and sets with their stream, and the launch each
  came from (``correlation``), so a kernel is read with the host operator that launched it;
- the rank, the world size and the process groups (``distributedInfo``: each group's ranks
  and its description, e.g. ``mesh_tp``); without ``distributedInfo`` the rank is the
  ``rankN`` in the file's name, else unknown (None: ``scalestudy.record.trace_terms`` reads
  a run's only trace as rank 0 of a world of 1). A ROCm trace is read like a CUDA one
  (``hip_runtime`` launches; its steps may be ``user_annotation`` ranges).

A trace that cannot be read (missing, over its size cap, cut, not JSON, not a trace, no
profiled step, an event with a time that is not a finite number) raises :class:`TraceError`
with one line saying why; the breakdown of that run is then empty with that reason.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from dataclasses import dataclass, field

from scalestudy.record.bounded_read import is_number
from scalestudy.config.files import ReadProblem, read_capped

#: The most bytes of a trace file read (compressed as stored); a larger one is refused.
MAX_TRACE_BYTES = 256 * 2**20
#: The most bytes a trace may hold once decompressed (JSON text).
MAX_TRACE_TEXT = 1024 * 2**20
#: The name ``torch.profiler`` gives a profiled step's range.
STEP_PREFIX = "ProfilerStep#"
#: Event categories of device activity (kernels, copies, sets) in a Kineto trace.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: Host-side launch categories whose ``correlation`` names the kernel they launched.
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "hip_runtime", "hip_driver")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)")


class TraceError(ValueError):
    """A trace that cannot be read: one line, the file and what is wrong."""


@dataclass(slots=True)
class Event:
    """One ``ph: X`` event: ``start``/``end`` in seconds, on thread ``tid`` of ``pid``."""

    name: str
    cat: str
    start: float
    end: float
    pid: object
    tid: object
    args: dict | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class Trace:
    """A rank's profiled steps and its events (module doc). ``steps``: the ``ProfilerStep#k``
    ranges of the main thread, in time order; ``host``: its other events; ``gpu``: device
    activity (empty on a CPU trace); ``launches``: host launch events by ``correlation``."""

    path: str
    rank: int | None
    world_size: int | None
    steps: list[Event]
    main_tid: object
    host: list[Event]
    gpu: list[Event] = field(default_factory=list)
    launches: dict = field(default_factory=dict)
    groups: list[dict] = field(default_factory=list)
    base_ns: int = 0  # ``baseTimeNanoseconds``: the wall clock (ns) at ts 0 (0: ts is the epoch's)

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu)


def _text(path: str, data: bytes) -> str:
    if data[:2] == b"\x1f\x8b":
        try:
            d = zlib.decompressobj(wbits=31)
            raw = d.decompress(data, MAX_TRACE_TEXT + 1)
            if len(raw) > MAX_TRACE_TEXT:
                raise TraceError(f"{os.path.basename(path)}: more than {MAX_TRACE_TEXT} bytes "
                                 "of JSON once decompressed: not read")
            if not d.eof:
                raise TraceError(f"{os.path.basename(path)}: cut (the gzip stream ends early)")
        except zlib.error as e:
            raise TraceError(f"{os.path.basename(path)}: not a gzip file ({e})") from None
        data = raw
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"{os.path.basename(path)}: not UTF-8 text (byte {e.start})") from None


def read_trace(path: str | os.PathLike, max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """The trace in ``path`` (module doc); :class:`TraceError` when it cannot be read."""
    path = os.fspath(path)
    name = os.path.basename(path)
    try:
        data = read_capped(path, max_bytes)
    except ReadProblem as e:
        what = {"size": f"{e.detail} bytes, more than the {max_bytes} a trace may hold",
                "os": f"cannot be read ({e.detail})"}.get(e.kind, "not a regular file")
        raise TraceError(f"{name}: {what}: not read") from None
    if data is None:
        raise TraceError(f"{name}: missing")
    text = _text(path, data)  # (its own TraceError names the file once)
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise TraceError(f"{name}: not JSON, or cut ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{name}: not a profiler trace (no traceEvents list)")
    return _parse(path, doc)


def _parse(path: str, doc: dict) -> Trace:
    name = os.path.basename(path)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    if rank is None:
        m = _RANK_IN_NAME.search(name)
        rank = int(m.group(1)) if m else None
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    groups = [g for g in info.get("pg_config") or [] if isinstance(g, dict)]
    steps, host, gpu, launches = [], [], [], {}
    for i, e in enumerate(doc["traceEvents"]):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur, ename = e.get("ts"), e.get("dur"), e.get("name")
        if not (is_number(ts) and is_number(dur) and dur >= 0 and isinstance(ename, str)):
            raise TraceError(f"{name}: event {i} has no finite ts/dur or no name: damaged")
        cat = e.get("cat") if isinstance(e.get("cat"), str) else ""
        args = e.get("args") if isinstance(e.get("args"), dict) else None
        ev = Event(ename, cat, ts * 1e-6, (ts + dur) * 1e-6, e.get("pid"), e.get("tid"), args)
        if cat in GPU_CATEGORIES:
            gpu.append(ev)
        elif ename.startswith(STEP_PREFIX) and not cat.startswith("gpu"):
            steps.append(ev)
        else:
            if cat in LAUNCH_CATEGORIES and args and "correlation" in args:
                launches[args["correlation"]] = ev
            host.append(ev)
    if not steps:
        raise TraceError(f"{name}: no profiled step (no {STEP_PREFIX}N range): nothing to read")
    steps.sort(key=lambda s: s.start)
    main = steps[0].tid
    host.sort(key=lambda ev: (ev.start, -ev.end))
    gpu.sort(key=lambda ev: ev.start)
    base = doc.get("baseTimeNanoseconds")
    return Trace(path=path, rank=rank, world_size=world, steps=[s for s in steps if s.tid == main],
                 main_tid=main, host=host, gpu=gpu, launches=launches, groups=groups,
                 base_ns=int(base) if isinstance(base, int) and not isinstance(base, bool) else 0)


def open_text(path: str | os.PathLike) -> str:
    """A trace file's JSON text (gzip or plain), for tools that read it themselves."""
    with (gzip.open if os.fspath(path).endswith(".gz") else open)(path, "rt") as f:
        return f.read()
