"""The checks every field of a point's parts gets when one is made (from the planner or a
``point.json``): integers are ints (never 2.0, never a bool), numbers are finite, counts are
at least 1 and within :mod:`scalestudy.config.limits`, names hold no path separator or
control character; a wrong value is a :class:`PointError` of one line naming the field."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import fields
from functools import lru_cache

from scalestudy.config import limits, settings


class PointError(ValueError):
    """A point that cannot be read or built; ``str()`` is one line naming the field."""


def is_integral(x) -> bool:
    t = type(x)
    if t is int:
        return True
    return t is not bool and t is not float and isinstance(x, numbers.Integral)


def is_finite_real(x) -> bool:
    t = type(x)
    if t is int:
        return True
    if t is float:
        return math.isfinite(x)
    return (t is not bool and isinstance(x, numbers.Real) and math.isfinite(x))


#: Checks of a field's value by its annotation: (test, what is allowed).
KINDS = {
    "int": (is_integral, "an integer"),
    "int | None": (lambda x: x is None or is_integral(x), "an integer or null"),
    "float": (is_finite_real, "a finite number"),
    "float | None": (lambda x: x is None or is_finite_real(x), "a finite number or null"),
    "int | float": (is_finite_real, "a finite number"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "str": (lambda x: isinstance(x, str), "text"),
    "str | None": (lambda x: x is None or isinstance(x, str), "text or null"),
}
#: Lower and upper bounds of the point's own counts (its parts' settings are declared, each
#: with its range: :mod:`scalestudy.config.settings`; None: no bound on that side).
RANGES = {
    "n": (1, limits.MAX_DEVICES), "tp": (1, limits.MAX_DEVICES), "pp": (1, limits.MAX_DEVICES),
    "cp": (1, limits.MAX_DEVICES),
    "micro_batch": (1, None), "nodes": (1, None),
    "procs_per_node": (1, limits.MAX_DEVICES_PER_NODE),
    "repeat": (0, limits.MAX_REPEATS - 1), "retries": (0, limits.MAX_RETRIES),
}
#: What a point id and the names in it may hold (they are folder names and Snakemake
#: wildcards).
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]+")
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")


@lru_cache(maxsize=None)
def _checked_fields(cls) -> tuple:
    return tuple((f.name, *KINDS[f.type]) for f in fields(cls) if f.type in KINDS)


def check_fields(obj, names=None) -> None:
    """Every annotated field of ``obj`` (or those in ``names``) against its type and range."""
    owner = type(obj).__name__.lower()
    for name, test, what in _checked_fields(type(obj)):
        if names is not None and name not in names:
            continue
        value = getattr(obj, name)
        if not test(value):
            raise PointError(f"{owner}.{name}: {short(value)} is not allowed ({what})")
        if value is None or isinstance(value, (str, bool)):
            continue
        declared = settings.meta(type(obj), name)
        if declared is not None:
            if settings.out_of_range(declared, value):
                raise PointError(f"{owner}.{name}: {short(value)} is not allowed "
                                 f"({settings.allowed(declared, settings.value_type(type(obj), name) is int)})")
            continue
        lo, hi = RANGES.get(name, (None, None))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f">= {lo}" if hi is None else f"from {lo} to {hi}"
            raise PointError(f"{owner}.{name}: {short(value)} is not allowed (an integer "
                             f"{rng})")


def check_name(owner: str, name: str, value: str) -> None:
    if value in (".", "..") or _UNSAFE_NAME.search(value):
        raise PointError(f"{owner}.{name}: {short(value)} is not allowed (letters, digits, "
                         "'_', '.', '-'; no path separator or control character)")


def short(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message stays one short line); an
    integer too long to print, by its size."""
    if is_integral(value) and int(value).bit_length() > 200:
        return f"an integer of about {int(int(value).bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def coerce(obj, name: str, enum) -> None:
    value = getattr(obj, name)
    try:
        object.__setattr__(obj, name, enum(value))
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise PointError(f"{type(obj).__name__.lower()}.{name}: {value!r} is not allowed; "
                         f"expected one of {allowed}") from None
