"""The study schema and the settings reference, generated from the declarations
(:mod:`scalestudy.config.settings`) and checked in: ``make schema`` writes them, a test fails
when a checked-in file differs from what this module generates. Nothing of them is written by
hand.

- ``workflow/schemas/study.schema.json`` is the schema studies are validated against
  (draft 2020-12, with defaults): the declared fields of :class:`~scalestudy.config.studyspec.
  Study`, each section's (a field whose type is a declared dataclass) in turn, what a series
  may set or sweep of every section, the tuning axes; the ``enum`` lists come from
  :data:`scalestudy.config.vocab.SCHEMA_ENUMS`.
- ``docs/reference/settings.md`` is the settings reference, section by section.
- The ``point.json`` example of ``docs/architecture.md`` and the placeholder list of
  ``docs/workloads.md`` are generated too (they need the planner: ``scalestudy.plan.docs_gen``,
  which ``make schema`` runs).

A new section is one module of declarations: a frozen dataclass whose fields are
:func:`~scalestudy.config.settings.setting`\\ s, and one declared field of ``Study`` of its type.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import typing
from pathlib import Path

from scalestudy.config import settings
from scalestudy.config.parts import (SERIES_SETTINGS, TUNED_SETTINGS,
                                     LogPatterns, Model, Parallel, Workload, section_of)
from scalestudy.config.settings import SeriesUse
from scalestudy.config.studyspec import SHAPE_AXES, Series, Study
from scalestudy.config.vocab import SCHEMA_ENUMS, TRAIN_PRECISIONS
from scalestudy.number_format import plain

_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
#: What a name in a path or a shell command may hold (study, series, model names).
SAFE_NAME = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


def _item_type(hint):
    """The item type of a list (``tuple[int, ...]``), else None."""
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0]
    return None


def _bounds(s: settings.Setting) -> dict:
    return {key: bound for key, bound in (("minimum", s.minimum), ("maximum", s.maximum),
                                          ("exclusiveMinimum", s.above),
                                          ("exclusiveMaximum", s.below)) if bound is not None}


def _is_section(t) -> bool:
    return isinstance(t, type) and dataclasses.is_dataclass(t) and bool(settings.declared(t))


def value_schema(cls, name: str, s: settings.Setting) -> dict:
    """The schema of one value of a declared setting: its special form, a list (its items'
    type and range), its ``$defs`` entry, a section, or its type and range; null allowed
    where the field may be None and the study may say so."""
    hint = settings.value_type(cls, name)
    item = _item_type(hint)
    if s.schema is not None:
        out = copy.deepcopy(s.schema)
    elif item is not None:
        one = ({"$ref": f"#/$defs/{s.ref}"} if s.ref else {"type": _TYPES[item], **_bounds(s)})
        out = {"type": "array", "items": one, "minItems": 1, "uniqueItems": True}
        if s.max_items is not None:
            out["maxItems"] = s.max_items
    elif s.ref:
        out = {"$ref": f"#/$defs/{s.ref}"}
    elif _is_section(hint):
        out = object_schema(hint)
    else:
        out = {"type": _TYPES[hint], **_bounds(s)}
        if s.pattern:
            out["pattern"] = s.pattern
    if settings.nullable(cls, name) and not s.optional:
        out = ({"oneOf": [out, {"type": "null"}]} if "type" not in out
               else {**out, "type": [out["type"], "null"]})
    return out


def _described(s: settings.Setting, more: str = "") -> str:
    unit = f" ({s.unit})" if s.unit else ""
    return f"{s.doc}{unit}{more}"


def _list_of(value: dict) -> dict:
    return {"type": "array", "items": value, "minItems": 1, "uniqueItems": True}


def object_schema(cls, defaults: bool = True) -> dict:
    """A section: every declared setting a study writes, with its default (``defaults``)
    unless the study must give it (``required``) or may leave it out (``optional``)."""
    props, required = {}, []
    for f, s in settings.declared(cls):
        if not s.study:
            continue
        prop = value_schema(cls, f.name, s)
        if defaults and settings.has_default(f) and not (s.required or s.optional):
            prop["default"] = settings.json_default(f)
        props[f.name] = {**prop, "description": _described(s)}
        if s.required:
            required.append(f.name)
    out = {"type": "object", "additionalProperties": False}
    if required:
        out["required"] = required
    return {**out, "properties": props}


def series_properties() -> dict:
    """What a series may give over the study's sections (every section's series settings): a
    value, or a list of values to sweep where the setting is swept."""
    out = {}
    for name in SERIES_SETTINGS:
        cls = section_of(name)
        s = settings.meta(cls, name)
        value = value_schema(cls, name, s)
        if s.series == SeriesUse.SWEEP:
            value = {"oneOf": [value, _list_of(value)]}
            more = "; a list sweeps it, one series per value"
        else:
            more = ""
        out[name] = {**value, "description": _described(s, f"{more} (default: the study's)")}
    return out


def tune_properties() -> dict:
    """The axes of a tuning search: the shape's and every section's tuned settings, a list of
    the values each may take."""
    out = {axis: _list_of({"$ref": "#/$defs/pos_int"}) for axis in SHAPE_AXES}
    for name, values in TUNED_SETTINGS.items():
        cls = section_of(name)
        s = settings.meta(cls, name)
        words = ", ".join(str(v) for v in values)
        out[name] = {**_list_of(value_schema(cls, name, s)),
                     "description": _described(s, f"; left out: {words}")}
    return out


def _defs() -> dict:
    """The schema's ``$defs``: the vocabulary's enums and the forms several fields share."""
    defs = {name: {"enum": [str(v) for v in values], "description": "vocab." + (
        "TRAIN_PRECISIONS" if values is TRAIN_PRECISIONS else type(values[0]).__name__)}
        for name, values in SCHEMA_ENUMS.items()}
    series = object_schema(Series)
    series["properties"].update(series_properties())
    log = object_schema(LogPatterns, defaults=False)
    defs.update({
        "safe_name": {"type": "string", "pattern": SAFE_NAME,
                      "description": "letters, digits, '_', '.', '-'; starts with a letter or "
                                     "digit; at most 64 characters"},
        "pos_int": {"type": "integer", "minimum": 1},
        "int_or_list": {"description": "one positive integer, or a list of them to sweep",
                        "oneOf": [{"$ref": "#/$defs/pos_int"},
                                  _list_of({"$ref": "#/$defs/pos_int"})]},
        "pp_partition": {
            "description": settings.meta(Parallel, "pp_partition").doc,
            "oneOf": [{"$ref": "#/$defs/pp_partition_method"},
                      {"type": "array", "items": {"type": "integer", "minimum": 1},
                       "minItems": 1}]},
        "log_patterns": {**log, "minProperties": 1, "description": LogPatterns.__doc__.split(
            "\n\n")[0].replace("\n    ", " ")},
        "workload": {"description": "builtin (scalestudy's trainer) or {command: [argv "
                                    "template], metrics, flops_per_token, cwd, traces}",
                     "oneOf": [{"$ref": "#/$defs/workload_kind"},
                               object_schema(Workload, defaults=False)]},
        "parallel": object_schema(Parallel),
        "model": object_schema(Model),
        "series": series,
        "tune_space": {"type": "object", "additionalProperties": False,
                       "properties": tune_properties()},
    })
    return dict(sorted(defs.items()))


def generate_schema() -> dict:
    """The study schema (module docstring)."""
    root = object_schema(Study)
    doc = " ".join(line.strip() for line in Study.__doc__.split("\n"))
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://scalestudy.invalid/study.schema.json",
            "title": "scalestudy study file", "description": doc, **root, "$defs": _defs()}


def schema_text() -> str:
    """``study.schema.json`` as written."""
    return json.dumps(generate_schema(), indent=1, ensure_ascii=False) + "\n"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _type_word(cls, name: str, s: settings.Setting) -> str:
    hint = settings.value_type(cls, name)
    item = _item_type(hint)
    word = (s.ref or (f"list of {_TYPES.get(item, 'values')}" if item is not None else
                      "object" if _is_section(hint) or s.schema else
                      _TYPES.get(hint, "value")))
    return f"{word} or null" if settings.nullable(cls, name) and not s.optional else word


def sections(root: type = Study) -> list[tuple[str, type]]:
    """Every section of the study, as its key path (``platform.site``, ``models.<name>``,
    ``series[]``) and its dataclass: the declared fields of ``root`` (:class:`Study`) whose
    type (or item type) is itself a declared dataclass, breadth first (a section met twice:
    its shortest path)."""
    out, queue, seen = [("", root)], [("", root)], {root}
    while queue:
        prefix, cls = queue.pop(0)
        for f, _ in settings.declared(cls):
            hint = settings.value_type(cls, f.name)
            args = typing.get_args(hint)
            inner, key = hint, f"{prefix}{f.name}"
            if typing.get_origin(hint) is tuple:
                inner, key = args[0], f"{key}[]"
            elif len(args) == 2 and typing.get_origin(hint) is not None:  # a mapping
                inner, key = args[1], f"{key}.<name>"
            if _is_section(inner) and inner not in seen:
                seen.add(inner)
                out.append((key, inner))
                queue.append((f"{key}.", inner))
    return out


def _range(s: settings.Setting) -> str:
    rng = []
    if s.minimum is not None:
        rng.append(f">= {plain(s.minimum)}")
    if s.above is not None:
        rng.append(f"> {plain(s.above)}")
    if s.maximum is not None:
        rng.append(f"<= {plain(s.maximum)}")
    if s.below is not None:
        rng.append(f"< {plain(s.below)}")
    return ", ".join(rng)


def _default_word(f, s: settings.Setting) -> str:
    if s.required:
        return "required"
    if not settings.has_default(f) or s.optional:
        return ""
    return f"`{json.dumps(settings.json_default(f))}`"


def reference_text() -> str:
    """``docs/reference/settings.md``: every declared setting, section by section."""
    lines = ["# Settings", "",
             "Every setting of a study file, section by section, as declared once "
             "(`scalestudy.config.settings`: the fields of `config/parts.py`, "
             "`config/site.py` and `config/studyspec.py`). This page, the whole study "
             "schema, the point id's roles, the series and tuning axes, the `plan.tsv` "
             "columns and the command template's placeholders are generated from those "
             "declarations (`make schema`; a test fails when this page differs).", "",
             "Columns: *allowed* is the range (bounds included unless `>` or `<`); *id*: "
             "whether the value enters the point's id (`always`, `when_set`: only when not "
             "the default, `never`); *series*: whether a series may give its own value "
             "(`override`) or a list to sweep (`sweep`); *tune*: the values a tuning axis "
             "takes when `tune.space` leaves it out; *plan*: a `plan.tsv` column; "
             "*{}*: a placeholder of a command workload's template.", ""]
    for key, cls in sections():
        if not any(s.study for _, s in settings.declared(cls)):
            continue  # (a section with a form of its own: the row of its field says it)
        title = f"`{key}:`" if key else "The study file (top level)"
        lines += [f"## {title}", ""]
        if cls is Series:
            lines += ["Besides these, a series may give any section's setting whose *series* "
                      "column says so: " + ", ".join(
                          f"`{n}` (`{k}:`)" for n, k in SERIES_SETTINGS.items()) + ".", ""]
        lines += [
                  "| setting | type | default | allowed | unit | id | series | tune | plan "
                  "| {} | what it sets |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for f, s in settings.declared(cls):
            if not s.study:
                continue
            tune = ("" if s.tune is None else
                    ", ".join(str(v) for v in settings.tuned(cls)[f.name]))
            cells = [f"`{f.name}`", _type_word(cls, f.name, s), _default_word(f, s), _range(s),
                     s.unit, str(s.hash), "" if s.series == SeriesUse.NONE else str(s.series),
                     tune, "yes" if s.column else "", "yes" if s.placeholder else "", s.doc]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def generated_files(repo: Path) -> dict[Path, str]:
    """Each file of the repository at ``repo`` this module generates, with its text."""
    return {repo / "workflow" / "schemas" / "study.schema.json": schema_text(),
            repo / "docs" / "reference" / "settings.md": reference_text()}
