"""A fake RAPL counter that advances with the training steps, not with time (test-only).

The trainer calls the per-step hook named by ``SCALESTUDY_STEP_HOOK``
(``scalestudy.train.hooks``) untimed before each step, just before the energy meter reads its
counter (``train.loop``: ``energy.chain(step_hook, meter.mark)``). A test sets, in the
environment the runner passes on to the ranks::

    SCALESTUDY_STEP_HOOK=fake_rapl:make_hook
    SCALESTUDY_FAKE_RAPL=<powercap>/intel-rapl:0/energy_uj
    PYTHONPATH=<repo>/tests:<repo>/src:...

and before step ``i`` every rank writes :func:`counter_uj` ``(i)`` (atomically, a temp file
per rank), so every reading is exact whatever the host's load: with data-parallel ranks in
lockstep (a step's gradient all-reduce needs every rank), no rank writes step ``i + 1``'s
value before every rank has read step ``i``'s, nor step ``i - 1``'s after it. Step ``i``'s
energy is ``counter_uj(i + 1) - counter_uj(i)`` = ``(i + 1)`` mJ; the last step's is 0 (the
meter's read after the loop follows no hook).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

FAKE_RAPL_ENV = "SCALESTUDY_FAKE_RAPL"
HOOK_SPEC = "fake_rapl:make_hook"


def counter_uj(step: int) -> int:
    """The counter (µJ) every rank writes before ``step``: 1 mJ x (1 + 2 + ... + step)."""
    return 1000 * step * (step + 1) // 2


def step_energy_j(step: int, steps: int) -> float:
    """The energy (J) the meter records for ``step`` of a run of ``steps`` steps."""
    return (counter_uj(step + 1) - counter_uj(step)) * 1e-6 if step < steps - 1 else 0.0


def make_hook(point, rank: int, environ: Mapping = os.environ) -> Callable[[int], None] | None:
    """The ``SCALESTUDY_STEP_HOOK`` factory: writes :func:`counter_uj` before each step."""
    path = Path(environ[FAKE_RAPL_ENV])
    tmp = path.with_name(f".energy_uj.rank{rank}")

    def hook(step: int) -> None:
        tmp.write_text(f"{counter_uj(step)}\n")
        os.replace(tmp, path)
    return hook
