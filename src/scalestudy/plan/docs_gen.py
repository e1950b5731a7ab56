"""Every generated file of the repository (``make schema``): the study schema and the settings
reference (:mod:`scalestudy.config.schema_gen`), and the generated blocks of the docs, each
between a ``<!-- generated: NAME -->`` and a ``<!-- end generated -->`` line:

- ``docs/architecture.md``, ``point.json``: the JSON of a planned point of the default study
  (``workflow/config/default.yaml``), every key a point carries;
- ``docs/workloads.md``, ``placeholders``: a command template's placeholders
  (``config.template.PLACEHOLDERS``);
- ``docs/studies.md``, ``defaults``: every key of a study file with its default.

A test fails when a checked-in file differs from what this module generates.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from scalestudy.config import schema_gen, settings
from scalestudy.config.study import load_study
from scalestudy.config.study_yaml import parse, read_text
from scalestudy.config.studyspec import Study
from scalestudy.config.template import PLACEHOLDERS
from scalestudy.plan.planner import plan_points

_WIDTH = 96


def _compact(value, indent: str = "") -> list[str]:
    """``value`` (a JSON object) as JSON lines of at most about :data:`_WIDTH` characters: the
    scalars of an object packed onto shared lines, each nested object on lines of its own."""
    items = list(value.items())
    lines, line = [], ""
    inner = indent + "  "
    for i, (key, v) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if isinstance(v, dict) and v:
            if line:
                lines.append(line.rstrip())
                line = ""
            lines.append(f"{inner}{json.dumps(key)}: {{")
            lines += _compact(v, inner)
            lines.append(f"{inner}}}{comma}")
            continue
        token = f"{json.dumps(key)}: {json.dumps(v)}{comma}"
        if line and len(line) + 1 + len(token) > _WIDTH:
            lines.append(line.rstrip())
            line = ""
        line = f"{line} {token}" if line else f"{inner}{token}"
    if line:
        lines.append(line.rstrip())
    return lines


def point_example(repo: Path) -> str:
    """The ``point.json`` of the default study's first point at N = 2 (or its first point)."""
    points = plan_points(load_study(repo / "workflow" / "config" / "default.yaml"))
    point = next((p for p in points if p.n == 2 and p.feasible), points[0])
    return "\n".join(["```json", "{", *_compact(point.to_json()), "}", "```"])


def _flow(key: str, value, comment: str) -> list[str]:
    """``key: value`` as YAML (JSON's flow forms), a mapping wrapped onto continuation lines
    of at most about :data:`_WIDTH` characters, ``# comment`` after it."""
    if not isinstance(value, dict) or not value:
        head = f"{key}: {json.dumps(value)}"
        return [f"{head:<30}# {comment}" if len(head) < 30 else f"{head}   # {comment}"]
    items = [f"{k}: {json.dumps(v)}" for k, v in value.items()]
    lines, line = [], f"{key}: {{"
    pad = " " * (len(key) + 3)
    for i, item in enumerate(items):
        token = item + ("," if i < len(items) - 1 else "}")
        if len(line) + 1 + len(token) > _WIDTH and not line.endswith("{"):
            lines.append(line)
            line = pad + token
        else:
            line = f"{line}{'' if line.endswith('{') else ' '}{token}"
    lines.append(line)
    return [f"# {comment}", *lines]


def defaults_yaml(repo: Path) -> str:
    """Every key of a study file with its default: each section as a flow mapping of its
    settings' defaults; what the study must give (its name, models, series) as the default
    study (``workflow/config/default.yaml``) gives it."""
    path = repo / "workflow" / "config" / "default.yaml"
    example = parse(read_text(path), str(path))  # (as written: what a study gives)
    lines = ["```yaml"]
    for f, s in settings.declared(Study):
        if s.required or not settings.has_default(f) or f.name == "series":
            value = example[f.name]
        elif s.schema is not None:  # a form of its own: as the validated default study has it
            value = load_study(path).to_json()[f.name]
        else:
            value = settings.json_default(f)
            kind = settings.value_type(Study, f.name)
            if isinstance(value, dict) and not value and schema_gen._is_section(kind):
                value = {g.name: settings.json_default(g) for g, t in settings.declared(kind)
                         if t.study and settings.has_default(g) and not t.optional}
        comment = re.split(r"; | \(|: |, ", s.doc)[0]
        if f.name in ("models", "series"):
            lines.append(f"{f.name + ':':<30}# {comment}")
            entries = value.items() if isinstance(value, dict) else enumerate(value)
            for k, v in entries:
                lines.append(f"  - {json.dumps(v)}" if f.name == "series" else
                             f"  {k}: {json.dumps(v)}")
            continue
        lines += _flow(f.name, value, comment)
    return "\n".join(lines + ["```"])


def placeholder_table() -> str:
    """The placeholders of a command template with what each holds."""
    rows = ["| placeholder | what it holds |", "|---|---|"]
    rows += [f"| `{{{name}}}` | {what.replace('|', chr(92) + '|')} |"
             for name, what in PLACEHOLDERS.items()]
    return "\n".join(rows)


def _blocks(repo: Path) -> dict[tuple[str, str], str]:
    return {("docs/architecture.md", "point.json"): point_example(repo),
            ("docs/studies.md", "defaults"): defaults_yaml(repo),
            ("docs/workloads.md", "placeholders"): placeholder_table()}


def _filled(text: str, name: str, block: str, path: str) -> str:
    pattern = re.compile(rf"(<!-- generated: {re.escape(name)} [^\n]*-->\n).*?(<!-- end "
                         rf"generated -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"{path}: no '<!-- generated: {name} (make schema) -->' ... "
                         "'<!-- end generated -->' block")
    return pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text, count=1)


def generated_files(repo: Path) -> dict[Path, str]:
    """Each generated file of the repository at ``repo`` with its text."""
    out = schema_gen.generated_files(repo)
    for (rel, name), block in _blocks(repo).items():
        path = repo / rel
        out[path] = _filled(out.get(path, path.read_text()), name, block, rel)
    return out


def write_generated(repo: Path) -> list[Path]:
    """Write the generated files of ``repo`` that differ (temporary file + rename); the paths
    written."""
    written = []
    for path, text in generated_files(repo).items():
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(path)
    return written
