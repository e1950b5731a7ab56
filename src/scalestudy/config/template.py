"""A command workload's template (``workload: {command: [...]}``) and its argv: the grammar
the study is checked against, filled from the typed point.

A study may run its own trainer instead of scalestudy's (``workload: {command: [...]}``):

    workload:
      command: ["{python}", train.py, --layers, "{layers}", --micro-batch, "{micro_batch}",
                "--steps={steps}", --out, "{point_dir}"]

The template is a list, one argument per element, never a shell string. Each ``{name}`` is
replaced by the point's value *inside its own element*: the argv has exactly as many
arguments as the template, whatever the values hold (spaces, quotes, ``;``, ``$(...)``,
newlines), and no shell ever reads it. A value may not turn an argument into an option (an
element whose template does not start with ``-`` may not start with ``-`` after filling),
nor name the program (``argv[0]`` is a literal or ``{python}``). ``{{`` and ``}}`` are literal
braces; there is no format mini-language (``{model.__class__}`` and ``{n:>5}`` are unknown
placeholders, refused when the study is planned).

``scalestudy.run.workload`` runs it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from scalestudy.config import settings
from scalestudy.config.parts import SETTING_SECTIONS, Model
from scalestudy.config.point import Point
from scalestudy.config.checks import PointError

#: The declared settings a template may use (``Setting.placeholder``), by section.
SETTING_PLACEHOLDERS = {key: settings.names(cls, placeholder=True)
                        for key, cls in {**SETTING_SECTIONS, "model": Model}.items()}

#: The point's values a template may use, with what each is.
PLACEHOLDERS: dict[str, str] = {
    # layout and batch
    "n": "world size (processes / devices)",
    "nodes": "nodes",
    "procs_per_node": "processes per node",
    "dp": "data-parallel degree",
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "micro_batch": "sequences per micro-batch per data-parallel rank",
    "grad_accum": "micro-batches per optimizer step per data-parallel rank",
    "global_batch": "sequences per optimizer step",
    "seq_len": "tokens per sequence",
    "tokens_per_step": "tokens per optimizer step (global_batch x seq_len)",
    # the declared settings: parallel, training, ..., the model block (Setting.placeholder)
    **{f.name: s.doc for key, cls in {**SETTING_SECTIONS, "model": Model}.items()
       for f, s in settings.declared(cls) if f.name in SETTING_PLACEHOLDERS[key]},
    # the model block's derived values
    "model": "the model's name (its key in models:)",
    "kv_heads": "key/value heads (= heads without grouped-query attention)",
    "head_dim": "hidden / heads",
    "ffn": "MLP width (ffn_hidden or the arch's rule)",
    # where and who
    "point_dir": "the run folder (absolute; also $SCALESTUDY_POINT_DIR)",
    "point_id": "the run's id",
    "study": "the study's name",
    "series": "the series' name",
    "repeat": "the repeat index",
    "python": "the Python interpreter running scalestudy (same torch)",
}

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class TemplateError(ValueError):
    """A template that cannot be filled; ``str()`` is one line naming the argument."""


def placeholders(template: list[str] | tuple[str, ...]) -> list[str]:
    """The placeholder names a template uses, in order; :class:`TemplateError` for an unknown
    name, a format spec or an unmatched brace."""
    names = []
    for i, element in enumerate(template):
        for m in _TOKEN.finditer(element):
            tok = m.group(0)
            if tok in ("{{", "}}"):
                continue
            if m.group(1) is None:
                raise TemplateError(f"command[{i}] {element!r}: unmatched {tok!r} (write "
                                    f"'{tok * 2}' for a literal brace)")
            name = m.group(1)
            if name not in PLACEHOLDERS:
                raise TemplateError(f"command[{i}] {element!r}: unknown placeholder {{{name}}}; "
                                    f"allowed: {', '.join('{' + k + '}' for k in PLACEHOLDERS)}")
            names.append(name)
    if template and _TOKEN.search(template[0]) and template[0] != "{python}":
        raise TemplateError(f"command[0] {template[0]!r}: the program is the template's own: a "
                            "literal path or {python}, not filled from the point")
    return names


def check_template(template) -> None:
    """Raise :class:`TemplateError` for a template that is not a list of strings with known
    placeholders."""
    if isinstance(template, str) or not isinstance(template, (list, tuple)) or not template:
        raise TemplateError("command: a non-empty list of arguments (argv), never a shell string")
    if not all(isinstance(a, str) for a in template):
        raise TemplateError("command: every argument must be a string (quote numbers: \"8\")")
    placeholders(template)


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        # a whole number as an integer (Megatron's --rotary-base is type=int: 500000), else
        # the shortest text that reads back as the same float (0.003, 1e-05)
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


def values(point: Point, point_dir: str | Path, python: str = sys.executable) -> dict[str, object]:
    """Every placeholder's value for ``point`` run in ``point_dir`` (None: no value)."""
    m = point.model
    return {
        "n": point.n, "nodes": point.nodes, "procs_per_node": point.procs_per_node,
        "dp": point.dp, "tp": point.tp, "pp": point.pp,
        "micro_batch": point.micro_batch, "grad_accum": point.grad_accum,
        "global_batch": point.global_batch, "seq_len": m.seq_len,
        "tokens_per_step": point.tokens_per_step,
        **{k: getattr(getattr(point, key), k)
           for key, names in SETTING_PLACEHOLDERS.items() for k in names},
        "model": m.name, "kv_heads": m.n_kv_heads, "head_dim": m.head_dim, "ffn": m.ffn,
        "point_dir": str(point_dir), "point_id": point.point_id, "study": point.study,
        "series": point.series, "repeat": point.repeat, "python": python,
    }


def expand(template, vals: dict[str, object]) -> list[str]:
    """The argv of ``template`` with ``vals`` filled in: one element per template element.

    Refused (:class:`TemplateError`): an unknown placeholder, a placeholder without a value,
    a value holding a NUL byte, a value that makes an argument start with ``-`` where its
    template does not (an option injected through a value), a filled ``argv[0]`` other than
    ``{python}``."""
    check_template(template)
    argv = []
    for i, element in enumerate(template):
        def fill(m: re.Match) -> str:
            tok = m.group(0)
            if tok == "{{":
                return "{"
            if tok == "}}":
                return "}"
            name = m.group(1)
            value = vals.get(name)
            if value is None:
                raise TemplateError(f"command[{i}] {element!r}: {{{name}}} has no value for "
                                    "this point (set it in the model block)")
            text = _text(value)
            if "\x00" in text:
                raise TemplateError(f"command[{i}]: the value of {{{name}}} holds a NUL byte")
            return text

        out = _TOKEN.sub(fill, element)
        if out.startswith("-") and not element.startswith("-"):
            raise TemplateError(f"command[{i}] {element!r}: a value would make it start with "
                                f"'-' ({out[:40]!r}), i.e. an option the template does not "
                                "have; refused")
        argv.append(out)
    return argv


def command_argv(point: Point, point_dir: str | Path, python: str = sys.executable) -> list[str]:
    """The expanded argv of ``point``'s command workload (one rank's command line)."""
    if not point.workload.is_command:
        raise PointError(f"{point.point_id}: workload is {point.workload.kind}, not a command")
    return expand(list(point.workload.command), values(point, point_dir, python))
