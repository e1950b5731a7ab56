"""Load a study file: ``yaml.safe_load``, JSON-schema validation (draft 2020-12), defaults.

Every problem is a :class:`StudyError` whose message is one line naming the field and the fix,
raised before any job starts.
"""

from __future__ import annotations

import copy
import re
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

from scalestudy.config.vocab import SCHEMA_ENUMS


class StudyError(ValueError):
    """A study file that cannot be run; ``str()`` is one line naming the field and the fix."""


def schema() -> dict:
    """The study schema (``workflow/schemas/study.schema.yaml``) with the ``enum`` lists of its
    vocabulary filled from :mod:`scalestudy.config.vocab` (a fresh copy: callers may edit)."""
    return copy.deepcopy(_schema())


@lru_cache(maxsize=1)
def _schema() -> dict:
    from scalestudy.paths import schema_file

    root = yaml.safe_load(schema_file().read_text())
    for name, values in SCHEMA_ENUMS.items():
        if name in root["$defs"]:
            root["$defs"][name]["enum"] = [str(v) for v in values]
    return root


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _allowed(sch: dict, root: dict) -> str:
    """What a schema fragment allows, in words."""
    if "$ref" in sch:
        sch = root["$defs"][sch["$ref"].rsplit("/", 1)[-1]]
    if "enum" in sch:
        return "one of " + ", ".join(map(str, sch["enum"]))
    if "oneOf" in sch:
        return " or ".join(_allowed(s, root) for s in sch["oneOf"])
    if "pattern" in sch:
        return sch.get("description", f"a string matching {sch['pattern']}")
    if sch.get("type") == "array":
        return "a list of " + _allowed(sch.get("items", {}), root)
    t = sch.get("type")
    if t in ("integer", "number") or (isinstance(t, list) and {"integer", "number"} & set(t)):
        word = "an integer" if t == "integer" or (isinstance(t, list) and "integer" in t) \
            else "a number"
        if "minimum" in sch:
            word += f" >= {sch['minimum']}"
        elif "exclusiveMinimum" in sch:
            word += f" > {sch['exclusiveMinimum']}"
        return word + (" or null" if isinstance(t, list) and "null" in t else "")
    t = sch.get("type")
    return f"a {t}" if isinstance(t, str) else ("one of types " + ", ".join(t) if t else "see the schema")


def _message(err: jsonschema.ValidationError, root: dict) -> str:
    where = _where(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed))
        hint = f"allowed keys: {', '.join(allowed)}" if allowed else "see the schema"
        return f"{where}: unknown key {', '.join(map(repr, extra))}; {hint}"
    if v == "required":
        return f"{where}: {err.message}; add it"
    if v == "propertyNames":
        return f"{where}: name {err.instance!r} is not allowed; use letters, digits, '_', '.', '-' (max 64)"
    if v in ("enum", "oneOf", "type", "pattern", "minimum", "exclusiveMinimum", "minItems",
             "uniqueItems", "minProperties"):
        detail = {"minItems": "must not be empty", "minProperties": "must not be empty",
                  "uniqueItems": "has duplicate entries"}.get(v)
        if detail:
            return f"{where}: {detail}"
        return f"{where}: {err.instance!r} is not allowed; expected {_allowed(err.schema, root)}"
    return f"{where}: {err.message}"


def _fill_defaults(instance, sch: dict, root: dict):
    """Insert ``default`` values of the schema's object properties (recursively)."""
    if "$ref" in sch:
        sch = root["$defs"][sch["$ref"].rsplit("/", 1)[-1]]
    if isinstance(instance, dict):
        for key, sub in sch.get("properties", {}).items():
            target = sub
            if "$ref" in sub:
                target = {**root["$defs"][sub["$ref"].rsplit("/", 1)[-1]], **sub}
            if key not in instance and "default" in target:
                instance[key] = copy.deepcopy(target["default"])
            if key in instance:
                _fill_defaults(instance[key], target, root)
        extra = sch.get("additionalProperties")
        if isinstance(extra, dict):
            for key in instance:
                if key not in sch.get("properties", {}):
                    _fill_defaults(instance[key], extra, root)
    elif isinstance(instance, list) and isinstance(sch.get("items"), dict):
        for item in instance:
            _fill_defaults(item, sch["items"], root)
    return instance


def validate(raw, source: str = "study") -> dict:
    """Validate a parsed study and return it with defaults filled; raise :class:`StudyError`."""
    if raw is None:
        raise StudyError(f"{source}: the file is empty; write a study (name:, models:, series:), "
                         "see workflow/config/default.yaml")
    if not isinstance(raw, dict):
        raise StudyError(f"{source}: the file must hold a mapping (name:, models:, series:), "
                         f"not {type(raw).__name__}")
    root = _schema()
    validator = jsonschema.Draft202012Validator(root)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        # the deepest error is the most specific one
        err = max(errors, key=lambda e: len(e.absolute_path))
        if err.context:
            err = max(err.context, key=lambda e: len(e.absolute_path))
        raise StudyError(f"{source}: {_message(err, root)}")
    study = _fill_defaults(copy.deepcopy(raw), root, root)
    for m in study["models"].values():  # mlp / bias null: the arch's own (config.point.Model)
        llama = m.get("arch") == "llama"
        if m.get("mlp") is None:
            m["mlp"] = "swiglu" if llama else "gelu"
        if m.get("bias") is None:
            m["bias"] = not llama
    _check_semantics(study, source)
    return study


def _check_semantics(study: dict, source: str) -> None:
    names = [s["name"] for s in study["series"]]
    for i, s in enumerate(study["series"]):
        where = f"{source}: series[{i}]"
        if names.count(s["name"]) > 1:
            raise StudyError(f"{where}.name: {s['name']!r} is used by more than one series; "
                             "give each series its own name")
        if s["model"] not in study["models"]:
            raise StudyError(f"{where}.model: {s['model']!r} is not defined; "
                             f"use one of {', '.join(study['models'])}")
        if s["mode"] == "strong" and "global_batch" not in s:
            raise StudyError(f"{where}.global_batch: required for mode strong "
                             "(sequences per step, fixed across the series)")
        if s["mode"] == "weak" and "global_batch" in s:
            raise StudyError(f"{where}.global_batch: not used in mode weak (it grows with DP); "
                             "remove it and set micro_batch and grad_accum")
        if "baseline" in s and s["baseline"] not in s["gpus"]:
            raise StudyError(f"{where}.baseline: {s['baseline']} is not in gpus {s['gpus']}; "
                             "pick one of the swept device counts")
    for name, m in study["models"].items():
        if m["hidden"] % m["heads"]:
            raise StudyError(f"{source}: models.{name}.heads: {m['heads']} does not divide "
                             f"hidden {m['hidden']}; choose heads dividing hidden")
        _check_model(name, m, source)
    _check_workload(study.get("workload"), f"{source}: workload")
    for i, s in enumerate(study["series"]):
        if "workload" in s:
            _check_workload(s["workload"], f"{source}: series[{i}].workload")
    t = study["train"]
    if t["warmup_steps"] >= t["steps"]:
        raise StudyError(f"{source}: train.warmup_steps: {t['warmup_steps']} leaves no timed "
                         f"step of {t['steps']}; make it smaller than train.steps")
    if study["platform"]["memory_limit_mb"] and study["platform"]["device"] != "cpu":
        raise StudyError(f"{source}: platform.memory_limit_mb: only for platform.device cpu "
                         "(an address-space limit breaks GPU runtimes); remove it or set "
                         "device: cpu")
    if study["platform"]["hardware"] is not None:
        from scalestudy.perf import hardware

        if hardware.device_key(study["platform"]["hardware"]) is None:
            keys = ", ".join(hardware.devices())
            raise StudyError(f"{source}: platform.hardware: unknown device "
                             f"{study['platform']['hardware']!r}; use one of {keys} or null")


def _check_model(name: str, m: dict, source: str) -> None:
    """The model block's own rules (``config.point.Model``: kv_heads, the arch's options)."""
    from scalestudy.config.point import Model, PointError

    try:
        Model(name=name, **m)
    except PointError as e:
        raise StudyError(f"{source}: {str(e).replace('model.', f'models.{name}.', 1)}") from None


def _check_workload(spec, where: str) -> None:
    """A ``workload:`` entry: a bare ``command`` has no argv, a template must be a list of
    strings with known placeholders, ``metrics: log`` needs its expressions."""
    from scalestudy.config.point import PointError, Workload
    from scalestudy.run.workload import TemplateError, check_template

    if isinstance(spec, dict):
        try:
            check_template(spec.get("command"))
        except TemplateError as e:
            raise StudyError(f"{where}.{e}") from None
        for key, rx in ((spec.get("metrics") or {}).get("log", {}) if isinstance(
                spec.get("metrics"), dict) else {}).items():
            try:
                re.compile(rx)
            except re.error as e:
                raise StudyError(f"{where}.metrics.log.{key}: not a regular expression "
                                 f"({e})") from None
    try:
        Workload.from_study(spec)
    except PointError as e:
        msg = str(e)
        for prefix, joint in (("workload.", "."), ("workload: ", ": ")):
            if msg.startswith(prefix):
                msg = joint + msg[len(prefix):]
                break
        else:
            msg = ": " + msg
        raise StudyError(f"{where}{msg}") from None


def _resolve_cwd(study: dict, folder: Path) -> None:
    """Command workloads run in ``cwd`` relative to the study file's folder (default: the
    folder itself), made absolute here so the runner finds it from any directory."""
    for holder in [study] + list(study["series"]):
        spec = holder.get("workload")
        if isinstance(spec, dict):
            spec["cwd"] = str((folder / spec.get("cwd", ".")).resolve())


class _DuplicateKey(ValueError):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (plain YAML keeps the
    last one silently, so a repeated ``steps:`` would hide a typo)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(f"duplicate key {key!r} at line {mark.line + 1}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_study(path: str | Path) -> dict:
    """Read, validate and resolve a study file. Raises :class:`StudyError`."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise StudyError(f"{path}: cannot read the study file ({e.strerror}); check the path")
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except _DuplicateKey as e:
        raise StudyError(f"{path}: {e}; keep one of them") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise StudyError(f"{path}: YAML syntax error{at}: {problem}; fix the file's syntax")
    study = validate(raw, str(path))
    _resolve_cwd(study, path.parent)
    return study
