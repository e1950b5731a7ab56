"""Fault injection for the tests: a rank that dies, hangs or lags at a chosen step of a real run.

Test-only (production code has no fault switch). The trainer calls a per-step hook named by
``SCALESTUDY_STEP_HOOK`` (``scalestudy.train.hooks``); a test that injects faults sets, in the
environment the runner passes on to torchrun and the ranks::

    SCALESTUDY_STEP_HOOK=fault_injection:make_hook
    SCALESTUDY_FAULT="kill:rank=1:step=3:match=kill_;hang:rank=1:step=2:match=hang_"
    PYTHONPATH=<repo>/tests:<repo>/src:...          (so the ranks can import this module)

``SCALESTUDY_FAULT`` is ``;``-separated ``KIND[:rank=R][:step=S][:match=SUB][:ms=MS]``:

- ``kill``: the rank SIGKILLs itself at the start of step S (a node or process dying);
- ``hang``: the rank sleeps forever at the start of step S, so its peers wait in a collective;
- ``slow``: the rank sleeps ``ms`` milliseconds before each step from S on (a straggler: it
  reaches every step late, so its peers wait for it in the step's collectives);
- ``rank`` (global rank, default 0), ``step`` (optimizer step from 0, default 0); ``match``
  (default: every point) limits the fault to points whose ``point_id`` contains SUB.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, Mapping

FAULT_ENV = "SCALESTUDY_FAULT"
#: What a test puts in ``SCALESTUDY_STEP_HOOK`` to enable this module.
HOOK_SPEC = "fault_injection:make_hook"
FAULT_KINDS = ("kill", "hang", "slow")


def parse_faults(text: str | None) -> list[dict]:
    """Faults from ``SCALESTUDY_FAULT`` (see the module docstring); ValueError naming the bad
    part otherwise."""
    faults = []
    for spec in filter(None, (t.strip() for t in (text or "").split(";"))):
        kind, *opts = spec.split(":")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r} in {spec!r}; use one of "
                             f"{', '.join(FAULT_KINDS)}")
        fault = {"kind": kind, "rank": 0, "step": 0, "match": "",
                 **({"ms": 0} if kind == "slow" else {})}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or key not in fault or key == "kind":
                raise ValueError(f"{FAULT_ENV}: bad option {opt!r} in {spec!r}; use rank=R, "
                                 "step=S, match=SUBSTRING (slow: also ms=MS)")
            fault[key] = value if key == "match" else int(value)
        faults.append(fault)
    return faults


def fault_for(point_id: str, rank: int, environ: Mapping = os.environ) -> dict | None:
    """The fault this rank of the point ``point_id`` must inject, or None (always None without
    ``SCALESTUDY_FAULT``)."""
    for fault in parse_faults(environ.get(FAULT_ENV)):
        if fault["rank"] == rank and fault["match"] in point_id:
            return fault
    return None


def inject_fault(fault: dict | None, step: int) -> None:
    """Act once the fault's step is reached: SIGKILL this process, or hang in it forever; a
    ``slow`` fault sleeps its ``ms`` before that step and every later one."""
    if fault is not None and fault["kind"] == "slow" and step >= fault["step"]:
        if step == fault["step"]:
            print(f"scalestudy fault injection: rank {fault['rank']} slow by {fault['ms']} ms "
                  f"a step from step {step}", file=sys.stderr, flush=True)
        time.sleep(fault["ms"] / 1000)
        return
    if fault is None or step != fault["step"]:
        return
    print(f"scalestudy fault injection: rank {fault['rank']} {fault['kind']} at step {step}",
          file=sys.stderr, flush=True)
    if fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: the peers wait in the step's collectives
        time.sleep(3600)


def make_hook(point, rank: int, environ: Mapping = os.environ) -> Callable[[int], None] | None:
    """The ``SCALESTUDY_STEP_HOOK`` factory: ``hook(step)`` for this rank of ``point``
    (a :class:`scalestudy.config.point.Point`), or None when no fault applies to it."""
    fault = fault_for(point.point_id, rank, environ)
    if fault is None:
        return None
    return lambda step: inject_fault(fault, step)
