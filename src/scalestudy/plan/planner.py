"""Expand a validated study into sweep points: weak/strong batch derivation, feasibility
(``scalestudy.plan.constraints``), point ids, ``plan.tsv``.

Weak scaling keeps tokens per device per step fixed: TP×PP fixed, DP = N/(TP·PP) grows,
micro-batch and accumulation fixed, global batch = micro_batch · grad_accum · DP.
Strong scaling keeps tokens per step fixed: global batch fixed, accumulation =
global_batch / (micro_batch · DP) shrinks as DP grows.

Points are :class:`scalestudy.config.point.Point`; infeasible ones carry ``feasible=False``
and the broken rule's sentence as ``reason``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from pathlib import Path

from scalestudy.config import limits, settings
from scalestudy.config.point import Point
from scalestudy.config.parts import SERIES_SETTINGS, SETTING_SECTIONS, Profile, section_of
from scalestudy.config.settings import SeriesUse
from scalestudy.config.checks import PointError
from scalestudy.config.identity import identify, point_id
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.studyspec import SHAPE_AXES, Series, Study
from scalestudy.config.template import TemplateError, command_argv
from scalestudy.config.vocab import ScalingMode
from scalestudy.perf import memory
from scalestudy.plan import constraints
from scalestudy.record.io import write_json, write_text
from scalestudy.record.source import with_source

#: A swept value's prefix in an expanded series' name (the settings' own: Setting.label).
SHAPE_LABELS = {"micro_batch": "mb"}
#: plan.tsv's columns: the point's shape and batch, its declared settings' columns
#: (Setting.column) of every section, then its verdict.
PLAN_COLUMNS = [
    "point_id", "config_hash", "series", "mode", "model", "n", "dp", "tp", "pp", "cp", "nodes",
    "procs_per_node", "micro_batch", "grad_accum", "global_batch", "seq_len", "tokens_per_step",
    "tokens_per_device_step",
    *(name for cls in SETTING_SECTIONS.values() for name in settings.names(cls, column=True)),
    "repeat", "baseline_n", "feasible", "reason", "mem_estimate_gb", "workload",
]
#: Every sweepable axis of a series: the shape's, then the swept settings of every section.
SWEEP_AXES = SHAPE_AXES + tuple(
    name for name, key in SERIES_SETTINGS.items()
    if settings.meta(SETTING_SECTIONS[key], name).series == SeriesUse.SWEEP)


def _axis(series: Series, axis: str):
    """The value (a tuple: the values swept) of a shape axis or a setting of ``series``."""
    return getattr(series, axis) if axis in SHAPE_AXES else series.settings.get(axis)


def _label(axis: str) -> str:
    if axis in SHAPE_AXES:
        return SHAPE_LABELS.get(axis, axis)
    label = settings.meta(section_of(axis), axis).label
    return axis if label is None else label


def _swept(series: Series) -> list[str]:
    """The sweepable axes of ``series`` that hold several values (a tuple)."""
    return [a for a in SWEEP_AXES if isinstance(_axis(series, a), tuple)]


def expand_series(series: Series) -> list[Series]:
    """A series whose sweepable axes hold lists -> one concrete series per combination, named
    ``<name>-<label><value>...`` for the list-valued axes only."""
    axes = _swept(series)
    if not axes:
        return [series]
    out = []
    for combo in itertools.product(*(_axis(series, a) for a in axes)):
        name = series.name + "".join(f"-{_label(a)}{v}" for a, v in zip(axes, combo))
        chosen = dict(zip(axes, combo))
        shape = {a: v for a, v in chosen.items() if a in SHAPE_AXES}
        own = {**series.settings, **{a: v for a, v in chosen.items() if a not in SHAPE_AXES}}
        out.append(replace(series, name=name, settings=own, **shape))
    return out


def grid_size(study: Study) -> int:
    """Runs (points x repeats) of a validated study once every sweep axis is expanded, counted
    without expanding anything."""
    runs = 0
    for series in study.series:
        combos = math.prod(len(_axis(series, a)) for a in _swept(series))
        runs += combos * len(series.gpus) * study.repeats
    return runs


def check_names(study: Study, source: str = "study") -> list[list[Series]]:
    """The expanded series of every series of a validated study, after checking the study's
    size (:data:`limits.MAX_RUNS`) and that no two expanded series share a name (``a`` with
    ``tp: [1, 2]`` becomes ``a-tp1`` and ``a-tp2``, which must not meet a series ``a-tp1``)."""
    runs = grid_size(study)
    if runs > limits.MAX_RUNS:
        raise StudyError(f"{source}: series: the study expands to {runs} runs (points x "
                         f"repeats) (at most {limits.MAX_RUNS}: fewer device counts, sweep "
                         "values or repeats)")
    expanded, owner = [], {}
    stages = 0  # pipeline stages the memory model evaluates, one by one, for every point
    for i, raw in enumerate(study.series):
        expanded.append(expand_series(raw))
        stages += sum(len(s.gpus) * s.pp for s in expanded[-1])
        if stages > limits.MAX_STAGE_EVALUATIONS:
            raise StudyError(f"{source}: series[{i}].pp: the study's points have more than "
                             f"{limits.MAX_STAGE_EVALUATIONS} pipeline stages in all (at most "
                             f"{limits.MAX_STAGE_EVALUATIONS}: the memory model evaluates every "
                             "stage of every point; fewer device counts or smaller pp)")
        for s in expanded[-1]:
            if s.name in owner and owner[s.name] != i:
                first, second = sorted((i, owner[s.name]))
                parts = [f"series[{k}] {study.series[k].name!r}"
                         + (" expanded" if study.series[k].name != s.name else "")
                         for k in (first, second)]
                raise StudyError(
                    f"{source}: series[{second}].name: {s.name!r} names two series once "
                    f"sweep axes are expanded ({parts[0]} and {parts[1]}; give each series a "
                    "name that no expansion of another one produces)")
            owner[s.name] = i
            if len(s.name) > limits.MAX_POINT_ID - 80:
                raise StudyError(f"{source}: series[{i}].name: the expanded name "
                                 f"{s.name[:40]!r}... has {len(s.name)} characters (at "
                                 f"most {limits.MAX_POINT_ID - 80}: sweep fewer axes)")
    return expanded


def series_points(study: Study, series: Series) -> list[Point]:
    """The points of one concrete series (no list-valued axes left), feasible or not, without
    repeats or ids."""
    model = study.models[series.model]
    # each section of settings: the study's, with the series' own over it
    own = {key: series.section(key, getattr(study, key)) for key in SETTING_SECTIONS}
    platform = own["platform"]
    workload = series.workload or study.workload
    if workload.is_command:  # a command profiles itself (workload.traces): the trainer's
        own["profile"] = Profile()
    capacities: dict[int, float | None] = {}
    out = []
    for n in series.gpus:
        batch = ({"global_batch": series.global_batch} if series.mode == ScalingMode.STRONG
                 else {"grad_accum": series.grad_accum})
        p = Point.build(model, n=n, tp=series.tp, pp=series.pp, cp=series.cp,
                        micro_batch=series.micro_batch, **batch, **own, study=study.name,
                        series=series.name, mode=series.mode,
                        flops_convention=study.flops_convention,
                        references=study.references, retries=study.retries,
                        workload=workload)
        if workload.is_command:
            _check_command(p, series.name)
        reason = constraints.violation(p)
        mem = None
        if reason is None:
            estimate = memory.estimate(p)
            mem = estimate["total_bytes"] / 1e9
            if p.procs_per_node not in capacities:
                capacities[p.procs_per_node] = constraints.capacity_bytes(platform,
                                                                          p.procs_per_node)
            if capacities[p.procs_per_node]:
                reason = constraints.memory_fit(p, capacities[p.procs_per_node], estimate)
        out.append(p.replace(feasible=reason is None, reason=reason or "", mem_estimate_gb=mem))
    return out


def _check_command(p: Point, series: str) -> None:
    """Fill the command template for ``p`` once, so a template that cannot be filled (an
    unknown placeholder, a value it refuses) stops the study before any job."""
    try:
        command_argv(p, "/point_dir", python="python")
    except TemplateError as e:
        raise StudyError(f"series {series!r}.workload.{e}") from None


def plan_points(study: Study, source: str = "study") -> list[Point]:
    """Every (point, repeat) of a validated study, feasible or not, in study order.
    ``source`` (the study file) starts every error message."""
    points: list[Point] = []
    seen: dict[tuple, str] = {}  # (mode, full SHA-256 of the config) -> series
    for expanded in check_names(study, source):
        for s in expanded:
            try:
                series = [identify(p) for p in series_points(study, s)]
            except PointError as e:
                raise StudyError(f"{source}: series {s.name!r}: {e}") from None
            for p in series:
                key = (p.mode, p.config_hash)
                if key in seen:
                    raise StudyError(
                        f"{source}: series {s.name!r}.gpus: point N={p.n} duplicates series "
                        f"{seen[key]!r} (same mode and resolved config); remove N={p.n} from "
                        "one of them or change a setting")
                seen[key] = s.name
            feasible_n = [p.n for p in series if p.feasible]
            baseline = s.baseline or (min(feasible_n) if feasible_n else min(s.gpus))
            for p in series:
                p = p.replace(baseline_n=baseline)
                # the hash leaves the repeat out: one hash per point, one id per repeat
                points += [p.replace(repeat=r, point_id=point_id(p, r))
                           for r in range(study.repeats)]
    if points and not any(p.feasible for p in points):
        first = points[0]
        raise StudyError(f"{source}: series {first.series!r}: no feasible point in the study (N="
                         f"{first.n}: {first.reason}); change the series' gpus, tp, pp, "
                         "micro_batch or global_batch so that at least one point fits")
    return points


def plan_rows(points: list[Point]) -> list[dict]:
    """Flat rows of ``plan.tsv`` (see ``PLAN_COLUMNS``)."""
    rows = []
    for p in points:
        doc = p.to_json()
        row = {k: doc.get(k) for k in PLAN_COLUMNS}
        row["model"] = p.model.name
        for section, cls in SETTING_SECTIONS.items():
            row.update({k: doc[section][k] for k in settings.names(cls, column=True)})
        part = p.parallel.pp_partition
        row["pp_partition"] = ",".join(map(str, part)) if isinstance(part, tuple) else part
        row["workload"] = p.workload.kind
        if row["mem_estimate_gb"] is not None:
            row["mem_estimate_gb"] = round(row["mem_estimate_gb"], 4)
        rows.append(row)
    return rows


def plan_table(points: list[Point]) -> str:
    """``plan.tsv`` text: tab-separated, header first; no tabs or newlines inside fields."""
    lines = ["\t".join(PLAN_COLUMNS)]
    for row in plan_rows(points):
        cells = ["" if row[k] is None else str(row[k]) for k in PLAN_COLUMNS]
        lines.append("\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells))
    return "\n".join(lines) + "\n"


def write_plan(points: list[Point], study_dir: Path, study: Study | None = None,
               source: str | None = None) -> str:
    """Write ``plan.tsv`` (and the resolved ``study.json`` when ``study`` is given, naming the
    study file ``source``: ``record.source``) into ``study_dir``, atomically; returns a
    one-line summary."""
    write_text(Path(study_dir) / "plan.tsv", plan_table(points))
    if study is not None:
        doc = study.to_json()
        write_json(Path(study_dir) / "study.json",
                   with_source(doc, source) if source is not None else doc)
    n_ok = sum(p.feasible for p in points)
    return f"{len(points)} runs planned, {n_ok} feasible, {len(points) - n_ok} skipped"
