"""Numbers as the tables, summaries and messages write them, and as text reads back into
them: one helper per meaning, for every stage. A missing value is written ``–``."""

from __future__ import annotations

import math

#: How a missing or non-finite value is written in a table or a sentence.
MISSING = "–"


def finite(x) -> float | None:
    """``x`` (a number or its text) as a finite float; None when it is not one."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def whole(x):
    """``x`` as an int when it is a whole number, else unchanged (2.0 -> 2, 2.5 -> 2.5)."""
    return int(x) if float(x).is_integer() else x


def plain(x) -> str:
    """A number as a message writes it: a whole one as an integer (1000000), else its
    shortest form (0.25, 1e-05)."""
    return str(int(x)) if float(x).is_integer() else f"{float(x):g}"


def fmt(x, spec: str = ".3g", scale: float = 1.0) -> str:
    """``x`` times ``scale`` in ``spec``; :data:`MISSING` when it is not a finite number."""
    v = finite(x)
    return MISSING if v is None else format(v * scale, spec)


def interval(v, lo, hi, spec: str = ".3g", scale: float = 1.0) -> str:
    """``v [lo, hi]`` (``v`` alone without both bounds; :data:`MISSING` without ``v``)."""
    if finite(v) is None:
        return MISSING
    if finite(lo) is not None and finite(hi) is not None:
        return f"{fmt(v, spec, scale)} [{fmt(lo, spec, scale)}, {fmt(hi, spec, scale)}]"
    return fmt(v, spec, scale)


def percent(x, digits: int = 1) -> str:
    """A fraction as a percentage (0.123 -> 12.3%); :data:`MISSING` when missing."""
    v = finite(x)
    return MISSING if v is None else f"{100 * v:.{digits}f}%"


def finite_or_nan(x) -> float:
    """``x`` as a finite float, NaN when it is not one (a table's missing cell)."""
    v = finite(x)
    return math.nan if v is None else v
