"""A record's loss when it is not a finite number: the run diverged.

JSON has no NaN or infinity, so a line of ``steps.jsonl`` (``scalestudy.record.steps``) writes
such a loss as ``"loss": null`` plus ``"loss_nonfinite": "nan" | "inf" | "-inf"``, and
``summary.json`` (``scalestudy.record.run_summary``) states the first one as ``loss_nonfinite``
and ``loss_nonfinite_step``. The reader (``scalestudy.record.run_records``) makes such a run
``invalid`` with :func:`diverged`'s reason. No imports: the writers and the reader share it.
"""

from __future__ import annotations

import math

#: The key that marks a step whose loss was not finite (the module doc).
NONFINITE_KEY = "loss_nonfinite"


def loss_fields(loss: float | None) -> dict:
    """The loss keys of a line: ``{"loss": x}``, or for NaN/±inf ``{"loss": None,
    "loss_nonfinite": "nan" | "inf" | "-inf"}`` (JSON has no such numbers)."""
    if loss is None:
        return {"loss": None}
    loss = float(loss)
    if math.isfinite(loss):
        return {"loss": loss}
    return {"loss": None, NONFINITE_KEY: repr(loss)}


def nonfinite_loss(rec: dict) -> str | None:
    """``"nan"``, ``"inf"`` or ``"-inf"`` when the line's loss was not finite (its
    ``loss_nonfinite`` marker, or a NaN/Infinity literal some other writer left in ``loss``),
    else None."""
    mark = rec.get(NONFINITE_KEY)
    if mark is not None:
        return str(mark)
    loss = rec.get("loss")
    if isinstance(loss, float) and not math.isfinite(loss):
        return repr(loss)
    return None


def first_nonfinite(records: list[dict]) -> tuple[int, str] | None:
    """``(step, marker)`` of the first line whose loss was not finite, or None."""
    for r in records:
        mark = nonfinite_loss(r)
        if mark is not None:
            return r.get("step"), mark
    return None


def diverged(step, mark: str) -> str:
    """The reason a diverged run is ``invalid`` (the one wording, for every reader)."""
    return f"loss diverged: non-finite loss ({mark}) at step {step}"
