"""An optional per-step hook of the training loop, named by an environment variable:

    SCALESTUDY_STEP_HOOK=package.module:factory

``factory(point, rank)`` returns a callable ``hook(step)`` that the loop calls untimed before
each optimizer step, or None. For fault-injection tests (``tests/fault_injection.py``) and
profiling; unset, nothing is imported. The variable is for the person who starts the run: a
study's ``site.env`` may not set it (``scalestudy.run.slurm``)."""

from __future__ import annotations

import importlib
import os
from typing import Callable

from scalestudy.config.point import Point

HOOK_ENV = "SCALESTUDY_STEP_HOOK"


def step_hook(point: Point, rank: int, environ=os.environ) -> Callable[[int], None] | None:
    """The hook named by ``SCALESTUDY_STEP_HOOK`` for this rank of ``point``, or None."""
    spec = environ.get(HOOK_ENV, "").strip()
    if not spec:
        return None
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"{HOOK_ENV}={spec!r}: expected 'package.module:factory'")
    factory = getattr(importlib.import_module(module), name)
    return factory(point, rank)
