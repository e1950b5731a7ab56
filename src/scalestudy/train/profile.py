"""Profiler traces of a point's steps, after its timed window (``profile:`` of a study).

Every rank runs ``profile.warmup + profile.steps`` more optimizer steps on the next batches of
the synthetic stream (the timed steps are untouched: their times are what they are without a
profiler); the ranks of ``profile.ranks`` run them under ``torch.profiler`` (host activity,
and the device's on a GPU), the first ``warmup`` as the profiler's warm-up, and write the
traced steps' Kineto JSON, gzip'd, to ``RUN_DIR/traces/rank<r>.json.gz`` (written beside,
then renamed: a trace is whole or absent). A trace over ``profile.max_mb`` is dropped and the
rank says so. Each traced step is a ``ProfilerStep#k`` range (``profile.step()`` after
it); the step hook (``train.hooks``) runs before each step, as in the timed window.

Each rank returns its record (``summary.json``'s ``profile``, per rank): whether it traced,
the trace's size or why there is none, its profiled steps' times (``StepTimer``, s) and the
median of its own timed steady steps, whose ratio is what the profiler cost this rank, and
the median over its traced steps of the time its training thread waited for a core within
each step's timed window (``runqueue_wait_s``: Linux's ``schedstat``; None elsewhere; at
most the step's time, not bounded by the trace's span, which ends at its last operator), and
the profiler's cost per recorded event measured on the rank before its traced steps
(``event_cost_s``, :func:`event_cost_s`; None on a GPU, whose trace is read on the device).
While a rank traces, a sampler thread reads its training thread's run-queue wait every
:data:`SAMPLE_PERIOD_S` (:class:`RunQueueSampler`) and writes the samples beside the trace
(``traces/rank<r>.runqueue.json``): the trace reader places each wait for a core where it
happened (``scalestudy.record.timeline``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from statistics import median
from typing import Callable

import torch

from scalestudy.config.layout import profiled_ranks
from scalestudy.config.point import Point
from scalestudy.record.trace_terms import RUNQUEUE_NAME, TRACE_NAME, TRACES_DIR
from scalestudy.train.metrics import StepTimer

#: The run-queue sampler's period (s): the resolution at which a wait for a core is placed.
SAMPLE_PERIOD_S = 0.002
#: Recorded operations timed with and without the profiler to measure its cost per event.
COST_OPS = 2000


def is_profiled(point: Point, rank: int) -> bool:
    """Whether ``rank`` of ``point`` writes a trace."""
    sizes = {"pp": point.pp, "dp": int(point.dp), "cp": point.cp, "tp": point.tp}
    return point.profile.enabled and rank in profiled_ranks(sizes, str(point.profile.ranks))


def _activities(device: torch.device) -> list:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


def _export(prof, path: Path, max_bytes: float, out: dict) -> None:
    """Write ``prof``'s trace to ``path`` (gzip'd, whole or not at all) within ``max_bytes``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name[:-len('.json.gz')]}.{os.getpid()}.tmp.json.gz")
    try:
        prof.export_chrome_trace(str(tmp))
        size = tmp.stat().st_size
        if size > max_bytes:
            out.update(state="dropped", bytes=size,
                       reason=f"trace of {size / 1e6:.1f} MB exceeds profile.max_mb "
                              f"{max_bytes / 1e6:g}")
            return
        os.replace(tmp, path)
        out.update(state="ok", bytes=size, file=f"{TRACES_DIR}/{path.name}")
    except OSError as e:
        out.update(state="failed", reason=f"trace not written: {e.strerror or e}")
    finally:
        tmp.unlink(missing_ok=True)


def runqueue_wait_s(path: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds this thread (or the one of ``path``) has waited on a run queue for a core since
    it started (the second field of Linux's ``schedstat``, ns), or None where it cannot be
    read."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class RunQueueSampler:
    """A thread that reads the process's run-queue waits every :data:`SAMPLE_PERIOD_S` while
    the profiler runs: ``samples``, ``[wall clock ns, training thread's wait ns, the other
    threads' wait ns]`` (cumulative; the other threads are the backend's, e.g. gloo's, whose
    waits hold up a transfer; the sampler's own excluded). The wall clock is the profiler's
    (a Kineto trace's ``ts`` is the wall clock in µs from its ``baseTimeNanoseconds``), so
    the trace reader places each wait where it happened. Nothing where ``schedstat`` cannot
    be read."""

    def __init__(self) -> None:
        self.main = threading.get_native_id()
        self.samples: list[list[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runqueue-sampler", daemon=True)

    def _waits(self) -> tuple[float | None, float]:
        main, others, me = None, 0.0, threading.get_native_id()
        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return None, 0.0
        for tid in tids:
            if tid == str(me):
                continue
            w = runqueue_wait_s(f"/proc/self/task/{tid}/schedstat")
            if tid == str(self.main):
                main = w
            elif w is not None:
                others += w
        return main, others

    def _sample(self) -> None:
        main, others = self._waits()
        if main is not None:
            self.samples.append([time.time_ns(), round(main * 1e9), round(others * 1e9)])

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(SAMPLE_PERIOD_S):
            self._sample()
        self._sample()

    def __enter__(self) -> "RunQueueSampler":
        if runqueue_wait_s(f"/proc/self/task/{self.main}/schedstat") is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _write_samples(samples: list, path: Path) -> None:
    """The sampler's samples beside the trace (written beside, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"clock": "wall_ns", "columns": ["time_ns", "main_ns",
                                                                     "others_ns"],
                                   "samples": samples}))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def event_cost_s(ops: int = COST_OPS, rounds: int = 5) -> float:
    """The profiler's cost per recorded event on this rank (s of the thread's CPU time, so
    that a busy host's scheduler does not count): ``ops`` in-place adds on a one-element
    tensor (one ``aten::add_`` event each), the fastest of ``rounds`` under an active CPU
    profiler less the fastest of ``rounds`` without, per op; at least 0."""
    x = torch.zeros(1)

    def one_round() -> float:
        t = time.thread_time()
        for _ in range(ops):
            x.add_(0)
        return time.thread_time() - t

    plain = min(one_round() for _ in range(rounds))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        traced = min(one_round() for _ in range(rounds))
    return max(0.0, (traced - plain) / ops)


def profiled_steps(train_step: Callable[[int], None], point: Point, rank: int,
                   device: torch.device, run_dir: Path, timed_s: list[float],
                   before_step: Callable[[int], None] | None = None) -> dict:
    """Run the profiled steps (module doc): ``train_step(i)`` trains the i-th step of the
    stream (``i`` from ``point.train.steps`` on), ``timed_s`` this rank's timed steps' times
    (s, warm-up included). Returns this rank's record."""
    prof_cfg, first = point.profile, point.train.steps
    traced = is_profiled(point, rank)
    out: dict = {"rank": rank, "traced": traced, "state": "off" if not traced else "ok",
                 "reason": "" if traced else "not a profiled rank (profile.ranks)"}
    timer, times, waits = StepTimer(device), [], []

    def one(i: int) -> None:
        if before_step is not None:
            before_step(i)
        with timer:  # (the wait read inside the timed window: a part of the step's time)
            q0 = runqueue_wait_s()
            train_step(i)
            q1 = runqueue_wait_s()
        times.append(timer.last)
        waits.append(None if q0 is None or q1 is None else q1 - q0)

    steps = range(first, first + prof_cfg.total_steps)
    if traced:
        out["event_cost_s"] = event_cost_s() if device.type == "cpu" else None
        schedule = torch.profiler.schedule(wait=0, warmup=prof_cfg.warmup,
                                           active=prof_cfg.steps, repeat=1)
        path = run_dir / TRACES_DIR / TRACE_NAME.format(rank=rank)
        with RunQueueSampler() as sampler, torch.profiler.profile(
                activities=_activities(device), schedule=schedule,
                on_trace_ready=lambda p: _export(p, path, prof_cfg.max_mb * 1e6, out)) as prof:
            for i in steps:
                one(i)
                prof.step()
        if sampler.samples and out.get("state") == "ok":
            _write_samples(sampler.samples, path.with_name(RUNQUEUE_NAME.format(rank=rank)))
    else:
        for i in steps:
            one(i)
    steady = timed_s[point.train.warmup_steps:]
    out["profiled_step_s"] = median(times[prof_cfg.warmup:]) if len(times) > prof_cfg.warmup else None
    kept = waits[prof_cfg.warmup:]
    out["runqueue_wait_s"] = median(kept) if kept and None not in kept else None
    out["timed_step_s"] = median(steady) if steady else None
    return out
