"""Rows of the prediction tables: a point's shape columns and a step breakdown as a row."""

from __future__ import annotations

from scalestudy.config.point import Point
from scalestudy.perf.breakdown import StepBreakdown


def shape_columns(p: Point) -> dict:
    """A point's parallel shape and batch as table columns."""
    return {"n": p.n, "dp": p.dp, "tp": p.tp, "pp": p.pp, "cp": p.cp,
            "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
            "global_batch": p.global_batch}


def breakdown_row(label: str, b: StepBreakdown, p: Point, extra: dict | None = None) -> dict:
    """One point's terms in seconds per step and as % of the (logged) time."""
    terms = {**b.terms(), **(extra or {})}
    total = sum(terms.values())
    out = {"point": label, "series": p.series, "mode": p.mode, **shape_columns(p),
           "step_time_s": b.step_time_s, "total_s": total, "bottleneck_stage": b.bottleneck_stage}
    out.update({k: v for k, v in terms.items()})
    out.update({f"pct_{k[:-2]}": 100 * v / total for k, v in terms.items()})
    return out
