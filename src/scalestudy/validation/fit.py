"""Fit the step model's one fitted constant on a declared subset of the published tables, and
measure every table out of sample.

    python -m scalestudy fit [--write]

The constant is ``sustained`` (``hardware.yaml`` ``gpu:``): the fraction of each GPU's
best-shape single-device GEMM ceiling and attention-kernel rate that a training run sustains.
Everything else is sourced. The fit minimises the mean over the subset's tables of each table's
mean ``|log(predicted / published)|`` (so a table of many rows weighs as much as one of few),
over a grid of ``GRID`` values refined by a parabola through the best three. ``FIT_TABLES``
is the declared subset: the tables whose every row states its whole layout, batch and
software and measures end-to-end training (module constant, written into the result); the
fit and its leave-one-table-out figures read only the rows that give their whole layout
(``validation.validate(published_layouts_only=True)``), at central values.

Leave-one-table-out (``loto``): for every table, the constant fitted on all the other tables
and that table's error with it, the out-of-sample figure for every table, fit subset or not.

``--write`` stores the result in ``data/perf_fit.yaml`` (the constant with its range, the
subset, the objective, the per-table in-sample and leave-one-out figures, the date and the
model's version); without it the result is only printed.
"""

from __future__ import annotations

import datetime as dt
import math
from importlib import resources

import yaml

from scalestudy.validation import published as validation
from scalestudy.record.io import write_text

#: The declared fit subset (module doc): Megatron-LM SC21 Table 1 (A100) and torchtitan's
#: published performance table (A100 and H100, FSDP / FSDP + TP).
FIT_TABLES = ("narayanan2021_sc21_table1", "torchtitan_perfdoc_2024")
CONSTANT = "sustained"
GRID = tuple(round(0.40 + 0.02 * i, 2) for i in range(31))  # 0.40 .. 1.00


def grid_errors(grid=GRID, names=None):
    """``{value: rows DataFrame}``: the validation at every grid value of the constant."""
    return {x: validation.validate(names, {CONSTANT: x}, ranges=False,
                                   published_layouts_only=True) for x in grid}


def objective(rows, tables) -> float:
    """Mean over ``tables`` of each table's mean ``|log(1 + error)|`` (modelled rows)."""
    ok = rows[(rows["skip"] == "") & rows["table"].isin(tables)]
    if ok.empty:
        return math.inf
    per = ok.assign(le=ok["error"].map(validation.log_error)).groupby("table")["le"].mean()
    return float(per.mean())


def best(errors: dict, tables) -> float:
    """The constant minimising ``objective`` over the grid, refined by the parabola through
    the best grid value and its neighbours (kept inside the grid)."""
    xs = sorted(errors)
    ys = [objective(errors[x], tables) for x in xs]
    i = min(range(len(xs)), key=ys.__getitem__)
    if 0 < i < len(xs) - 1:
        (x0, x1, x2), (y0, y1, y2) = xs[i - 1:i + 2], ys[i - 1:i + 2]
        den = (x0 - x1) * (x0 - x2) * (x1 - x2)
        a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / den
        b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / den
        if a > 0:
            return round(min(max(-b / (2 * a), x0), x2), 3)
    return xs[i]


def fit(fit_tables=FIT_TABLES, errors: dict | None = None) -> dict:
    """The fit (module doc): the constant, its range (the spread of the leave-one-table-out
    fits) and, per table, the in-sample and leave-one-out MAPE and bias."""
    errors = errors or grid_errors()
    tables = sorted(set(next(iter(errors.values()))["table"]))
    value = best(errors, fit_tables)
    rows = validation.validate(None, {CONSTANT: value}, ranges=False, published_layouts_only=True)
    summary = validation.summary(rows).set_index("table")
    per_table, loto_values = {}, []
    for t in tables:
        if summary.loc[t, "rows"] == 0:
            continue
        v = best(errors, [x for x in tables if x != t])
        loto_values.append(v)
        out = validation.summary(validation.validate(
            [t], {CONSTANT: v}, ranges=False, published_layouts_only=True)).iloc[0]
        per_table[t] = {"in_fit": t in fit_tables, "rows": int(summary.loc[t, "rows"]),
                        "mape": round(float(summary.loc[t, "mape"]), 4),
                        "bias": round(float(summary.loc[t, "bias"]), 4),
                        "loto_constant": v, "loto_mape": round(float(out["mape"]), 4),
                        "loto_bias": round(float(out["bias"]), 4)}
    lo, hi = min(loto_values + [value]), max(loto_values + [value])
    return {"constants": {CONSTANT: {"value": value, "low": lo, "high": hi, "source": (
                "fitted by python -m scalestudy fit on " + ", ".join(fit_tables)
                + "; range: the leave-one-table-out fits")}},
            "fit": {"tables": list(fit_tables), "fitted_constants": 1,
                    "objective": "mean over tables of mean |log(predicted/published)|",
                    "grid": [GRID[0], GRID[-1], len(GRID)],
                    "date": dt.date.today().isoformat(), "per_table": per_table}}


def write(result: dict) -> str:
    """Store ``result`` as ``data/perf_fit.yaml`` (in the source tree the package runs from)."""
    path = str(resources.files("scalestudy").joinpath("data", "perf_fit.yaml"))
    head = ("# Written by `python -m scalestudy fit --write` (scalestudy/validation/fit.py): the\n"
            "# fitted constants of the step model, the subset they were fitted on and every\n"
            "# table's in-sample and leave-one-table-out error. Do not edit by hand.\n")
    write_text(path, head + yaml.safe_dump(result, sort_keys=False))
    return path
