"""The study schema and the settings reference, generated from the declarations
(:mod:`scalestudy.config.settings`) and checked in: ``make schema`` writes them, a test fails
when a checked-in file differs from what this module generates.

- ``workflow/schemas/study.schema.yaml`` is the schema's frame, written by hand: the study's
  structure, with a marker where declared settings go: ``x-settings: <section>`` (the
  section's properties, with defaults), ``x-series-settings: parallel`` (what a series may set
  or sweep), ``x-tune-settings: parallel`` (the tuning axes). The ``enum`` lists come from
  :data:`scalestudy.config.vocab.SCHEMA_ENUMS`.
- ``workflow/schemas/study.schema.json`` is the schema studies are validated against.
- ``docs/reference/settings.md`` is the settings reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scalestudy.number_format import plain
from scalestudy import paths
from scalestudy.config import settings
from scalestudy.config.parts import SETTING_SECTIONS
from scalestudy.config.settings import SeriesUse
from scalestudy.config.vocab import SCHEMA_ENUMS

_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}


def value_schema(cls, name: str, s: settings.Setting) -> dict:
    """The schema of one value of a declared setting (its ``$defs`` entry, or its type and
    range; null allowed where the field may be None)."""
    if s.ref:
        out = {"$ref": f"#/$defs/{s.ref}"}
    else:
        out = {"type": _TYPES[settings.value_type(cls, name)]}
        for key, bound in (("minimum", s.minimum), ("maximum", s.maximum),
                           ("exclusiveMinimum", s.above)):
            if bound is not None:
                out[key] = bound
    if settings.nullable(cls, name):
        out = ({"oneOf": [out, {"type": "null"}]} if s.ref
               else {**out, "type": [out["type"], "null"]})
    return out


def _described(s: settings.Setting, more: str = "") -> str:
    unit = f" ({s.unit})" if s.unit else ""
    return f"{s.doc}{unit}{more}"


def _list_of(value: dict) -> dict:
    return {"type": "array", "items": value, "minItems": 1, "uniqueItems": True}


def section_properties(cls) -> dict:
    """A study section's properties: every declared setting with its default."""
    return {f.name: {**value_schema(cls, f.name, s), "default": settings.json_default(f),
                     "description": _described(s)}
            for f, s in settings.declared(cls)}


def series_properties(cls) -> dict:
    """What a series may give over the study's section: a value, or a list of values to sweep
    where the setting is swept."""
    out = {}
    for f, s in settings.declared(cls):
        if s.series == SeriesUse.NONE:
            continue
        value = value_schema(cls, f.name, s)
        if s.series == SeriesUse.SWEEP:
            value = {"oneOf": [value, _list_of(value)]}
            more = "; a list sweeps it, one series per value"
        else:
            more = ""
        out[f.name] = {**value, "description": _described(s, f"{more} (default: the study's)")}
    return out


def tune_properties(cls) -> dict:
    """The tuning axes: a list of the values each may take."""
    out = {}
    for name, values in settings.tuned(cls).items():
        s = settings.meta(cls, name)
        words = ", ".join(str(v) for v in values)
        out[name] = {**_list_of(value_schema(cls, name, s)),
                     "description": _described(s, f"; left out: {words}")}
    return out


_MARKERS = {"x-settings": section_properties, "x-series-settings": series_properties,
            "x-tune-settings": tune_properties}


def _fill(node):
    if isinstance(node, dict):
        node = {k: _fill(v) for k, v in node.items()}
        for marker, make in _MARKERS.items():
            if marker in node:
                cls = SETTING_SECTIONS[node.pop(marker)]
                node["properties"] = {**node.get("properties", {}), **make(cls)}
        return node
    if isinstance(node, list):
        return [_fill(v) for v in node]
    return node


def generate_schema() -> dict:
    """The study schema: the frame with its markers and enum lists filled."""
    root = _fill(yaml.safe_load(paths.schema_frame().read_text()))
    for name, values in SCHEMA_ENUMS.items():
        if name in root["$defs"]:
            root["$defs"][name]["enum"] = [str(v) for v in values]
    return root


def schema_text() -> str:
    """``study.schema.json`` as written."""
    return json.dumps(generate_schema(), indent=1, ensure_ascii=False) + "\n"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def _type_word(cls, name: str, s: settings.Setting) -> str:
    word = s.ref or _TYPES[settings.value_type(cls, name)]
    return f"{word} or null" if settings.nullable(cls, name) else word


def reference_text() -> str:
    """``docs/reference/settings.md``: every declared setting, section by section."""
    lines = ["# Settings", "",
             "Every setting of a study's `parallel:`, `train:` and `profile:` sections, as "
             "declared once in `src/scalestudy/config/parts.py` "
             "(`scalestudy.config.settings`). This page, the study schema's sections, the "
             "point id's roles, the series and tuning axes, the `plan.tsv` columns and the "
             "command template's placeholders are generated from those declarations "
             "(`make schema`; a test fails when this page differs).", "",
             "Columns: *allowed* is the range (bounds included unless `>`); *id*: whether "
             "the value enters the point's id (`always`, `when_set`: only when not the "
             "default, `never`); *series*: whether a series may give its own value "
             "(`override`) or a list to sweep (`sweep`); *tune*: the values a tuning axis "
             "takes when `tune.space` leaves it out; *plan*: a `plan.tsv` column; "
             "*{}*: a placeholder of a command workload's template.", ""]
    for key, cls in SETTING_SECTIONS.items():
        lines += [f"## `{key}:`", "",
                  "| setting | type | default | allowed | unit | id | series | tune | plan "
                  "| {} | what it sets |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for f, s in settings.declared(cls):
            rng = []
            if s.minimum is not None:
                rng.append(f">= {plain(s.minimum)}")
            if s.above is not None:
                rng.append(f"> {plain(s.above)}")
            if s.maximum is not None:
                rng.append(f"<= {plain(s.maximum)}")
            tune = ("" if s.tune is None else
                    ", ".join(str(v) for v in settings.tuned(cls)[f.name]))
            default = json.dumps(settings.json_default(f))
            cells = [f"`{f.name}`", _type_word(cls, f.name, s), f"`{default}`", ", ".join(rng),
                     s.unit, str(s.hash), "" if s.series == SeriesUse.NONE else str(s.series),
                     tune, "yes" if s.column else "", "yes" if s.placeholder else "", s.doc]
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def generated_files(repo: Path) -> dict[Path, str]:
    """Each generated file of the repository at ``repo`` with its text."""
    return {repo / "workflow" / "schemas" / "study.schema.json": schema_text(),
            repo / "docs" / "reference" / "settings.md": reference_text()}


def write_generated(repo: Path) -> list[Path]:
    """Write the generated files of ``repo`` that differ (each whole: a temporary file
    renamed over it); the paths written."""
    written = []
    for path, text in generated_files(repo).items():
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(path)
    return written
