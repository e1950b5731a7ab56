"""Load a study file: libyaml's safe loader, JSON-schema validation (draft 2020-12), defaults;
the result is the typed :class:`~scalestudy.config.studyspec.Study`, built once.

Every problem is a :class:`StudyError` whose message is one line naming the file, the field and
the fix, raised before any job starts; no file, however malformed or hostile, gives a
traceback. The file is read within the limits of :mod:`scalestudy.config.limits` (size,
nesting, nodes, entries; no YAML anchors, aliases or tags), every mapping key must be text,
every number finite, and the schema is applied with JSON's own meaning of ``integer`` (2.0 is
not one) and of ``pattern`` (``$`` is the end of the string, not a final newline).
"""

from __future__ import annotations

import copy
import datetime
import json
import math
import re
import sys
from collections import Counter
from functools import lru_cache
from pathlib import Path

from scalestudy.config import devices, limits
from scalestudy.config.parts import Model, Workload
from scalestudy.config.checks import PointError, short
from scalestudy.config.sitepolicy import SiteError
from scalestudy.config.studyspec import Study
from scalestudy.config.template import TemplateError, check_template
from scalestudy.config.vocab import Device, did_you_mean
from scalestudy.paths import schema_file
from scalestudy.config.study_yaml import StudyError, parse, place, read_text


def _import_jsonschema():
    """jsonschema without its optional ``iri`` format checker. jsonschema imports every
    format checker it finds, and rfc3987_syntax (which ``jsonschema[format-nongpl]`` brings,
    e.g. through Jupyter with the ``hta`` extra) builds 38 Earley parsers as it is imported:
    about 1.4 s of CPU in every process that loads a study, each Snakemake job's included
    (python-jsonschema/jsonschema#1428). The study schema checks no format; a process that
    imported either module before keeps it as it was."""
    if "jsonschema" in sys.modules or "rfc3987_syntax" in sys.modules:
        import jsonschema
        return jsonschema
    sys.modules["rfc3987_syntax"] = None  # its import fails; jsonschema goes on without it
    try:
        import jsonschema
        return jsonschema
    finally:
        del sys.modules["rfc3987_syntax"]


jsonschema = _import_jsonschema()


def schema() -> dict:
    """The study schema (``workflow/schemas/study.schema.json``, generated from its frame and
    the declared settings by :mod:`scalestudy.config.schema_gen`; a fresh copy: callers may
    edit)."""
    return copy.deepcopy(_schema())


@lru_cache(maxsize=1)
def _schema() -> dict:
    return json.loads(schema_file().read_text())


def _enum_words(sch: dict, root: dict) -> list:
    """The words an ``enum`` of a schema fragment (or of its ``oneOf`` branches) allows."""
    sch = _deref(sch, root)
    return list(sch.get("enum", [])) + [w for branch in sch.get("oneOf", [])
                                         for w in _enum_words(branch, root)]


def _deref(sch: dict, root: dict) -> dict:
    """``sch`` with its ``$ref`` resolved; keywords beside the ``$ref`` win."""
    if "$ref" not in sch:
        return sch
    target = _deref(root["$defs"][sch["$ref"].rsplit("/", 1)[-1]], root)
    return {**target, **{k: v for k, v in sch.items() if k != "$ref"}}


def _allowed(sch: dict, root: dict) -> str:
    """What a schema fragment allows, in words (a pattern: its shared form's own words, e.g.
    a safe name's, or the pattern)."""
    form = (root["$defs"][sch["$ref"].rsplit("/", 1)[-1]] if "$ref" in sch
            else sch if any(sch is d for d in root["$defs"].values()) else {})
    sch = _deref(sch, root)
    if "enum" in sch:
        return "one of " + ", ".join(map(str, sch["enum"]))
    if "oneOf" in sch:
        return " or ".join(_allowed(s, root) for s in sch["oneOf"])
    if "pattern" in sch:
        return form.get("description") or f"a string matching {sch['pattern']}"
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
        if "maximum" in sch:
            word += f" and <= {sch['maximum']}"
        elif "exclusiveMaximum" in sch:
            word += f" and < {sch['exclusiveMaximum']}"
        return word + (" or null" if isinstance(t, list) and "null" in t else "")
    t = sch.get("type")
    return f"a {t}" if isinstance(t, str) else ("one of types " + ", ".join(t) if t else "see the schema")


def _message(err: jsonschema.ValidationError, root: dict) -> str:
    where = place(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(map(str, err.instance)) - set(allowed))
        hint = f"allowed keys: {', '.join(allowed)}" if allowed else "see the schema"
        shown = ", ".join(short(k) for k in extra[:3]) + (" ..." if len(extra) > 3 else "")
        near = did_you_mean(extra[0], allowed) if len(extra) == 1 else ""
        return f"{where}: unknown key {shown}{near}{' ' if near else '; '}{hint}"
    if v == "required":
        return f"{where}: {err.message}; add it"
    if v == "propertyNames":
        return f"{where}: name {short(err.instance)} is not allowed; use letters, digits, '_', '.', '-' (max 64)"
    if v in ("maxItems", "maxProperties", "maxLength"):
        what = {"maxItems": "entries", "maxProperties": "keys", "maxLength": "characters"}[v]
        return (f"{where}: has {len(err.instance)} {what} (at most "
                f"{err.schema[v]})")
    if v in ("enum", "oneOf", "type", "pattern", "minimum", "exclusiveMinimum", "minItems",
             "uniqueItems", "minProperties", "maximum", "exclusiveMaximum"):
        detail = {"minItems": "must not be empty", "minProperties": "must not be empty",
                  "uniqueItems": "has duplicate entries"}.get(v)
        if detail:
            return f"{where}: {detail}"
        near = did_you_mean(err.instance, _enum_words(err.schema, root))
        return (f"{where}: {short(err.instance)} is not allowed; expected "
                f"{_allowed(err.schema, root)}{near}")
    return f"{where}: {err.message[:200]}"


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


def _strict_integer(checker, instance) -> bool:
    """JSON's integer: an int, not a bool and not a whole float (jsonschema counts 2.0 as an
    integer, and ``range(2.0)`` fails far from the file)."""
    return isinstance(instance, int) and not isinstance(instance, bool)


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    # JSON Schema's regular expressions are ECMA-262's, where a final ``$`` is the end of the
    # string; Python's ``$`` also matches before a final newline ("abc\n" would pass ^abc$).
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _identity(x):
    """A hashable stand-in for a JSON value: equal exactly when JSON Schema calls the values
    equal (1 == 1.0, true != 1)."""
    if isinstance(x, bool):
        return ("bool", x)
    if isinstance(x, (int, float)):
        return ("number", x)
    if isinstance(x, list):
        return ("list", tuple(_identity(v) for v in x))
    if isinstance(x, dict):
        return ("object", frozenset((k, _identity(v)) for k, v in x.items()))
    return (type(x).__name__, x)


def _unique_items(validator, unique, instance, schema):
    # jsonschema compares unsortable items (mappings) pairwise: 10,000 of them took minutes
    if unique and validator.is_type(instance, "array"):
        ids = [_identity(v) for v in instance]
        if len(set(ids)) < len(ids):
            yield jsonschema.ValidationError(f"{short(instance)} has non-unique elements")


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _pattern, "uniqueItems": _unique_items},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer",
                                                                        _strict_integer),
)


def _number_word(x: float) -> str:
    return ".nan" if math.isnan(x) else (".inf" if x > 0 else "-.inf")


def _check_values(raw, source: str) -> None:
    """What JSON Schema cannot say about a parsed file: every mapping key is text, every number
    finite and at most :data:`limits.MAX_INT`, only JSON's types (YAML also makes dates), and
    the nesting, size and entry limits (for studies given as Python objects too)."""
    stack = [(raw, (), 0)]
    nodes = 0
    while stack:
        obj, path, depth = stack.pop()
        nodes += 1
        if depth > limits.MAX_DEPTH:
            raise StudyError(f"{source}: {place(path)}: nested deeper than "
                             f"{limits.MAX_DEPTH} levels (at most {limits.MAX_DEPTH})")
        if nodes > limits.MAX_NODES:
            raise StudyError(f"{source}: (file): more than {limits.MAX_NODES} values "
                             f"(at most {limits.MAX_NODES})")
        if isinstance(obj, dict):
            if len(obj) > limits.MAX_ITEMS:
                raise StudyError(f"{source}: {place(path)}: has {len(obj)} keys "
                                 f"(at most {limits.MAX_ITEMS})")
            for key, value in obj.items():
                if not isinstance(key, str):
                    kind = ("a boolean (YAML reads yes/no/on/off/true/false as one)"
                            if isinstance(key, bool) else "null" if key is None else
                            "a number" if isinstance(key, (int, float)) else
                            f"a {type(key).__name__}")
                    raise StudyError(f"{source}: {place(path)}: key {short(key)} is {kind}, "
                                     "not a name (keys are text: quote it)")
                stack.append((value, path + (key,), depth + 1))
        elif isinstance(obj, list):
            if len(obj) > limits.MAX_ITEMS:
                raise StudyError(f"{source}: {place(path)}: has {len(obj)} entries "
                                 f"(at most {limits.MAX_ITEMS})")
            stack.extend((v, path + (i,), depth + 1) for i, v in enumerate(obj))
        elif isinstance(obj, float):
            if not math.isfinite(obj):
                raise StudyError(f"{source}: {place(path)}: {_number_word(obj)} is not "
                                 "allowed (a finite number)")
        elif isinstance(obj, int) and not isinstance(obj, bool):
            if abs(obj) > limits.MAX_INT:
                raise StudyError(f"{source}: {place(path)}: {short(obj)} is too large "
                                 f"(at most 2**53 = {limits.MAX_INT})")
        elif not (obj is None or isinstance(obj, (str, bool))):
            kind = ("a date (YAML reads YYYY-MM-DD as one)"
                    if isinstance(obj, (datetime.date, datetime.datetime)) else
                    f"a {type(obj).__name__}")
            raise StudyError(f"{source}: {place(path)}: {short(obj)} is {kind} (text, "
                             "numbers, true/false, null, lists and mappings: quote it)")


def validate(raw, source: str = "study", trust_site: bool = False,
             folder: Path | None = None) -> Study:
    """Validate a parsed study and return it typed, defaults filled; raise
    :class:`StudyError`. ``trust_site``: ``platform.site`` may set any environment variable
    and more options (:mod:`scalestudy.config.sitepolicy`; ``scalestudy run --trust-site``).
    ``folder``: the study file's folder, against which command workloads' ``cwd`` is made
    absolute (None: left as written)."""
    if raw is None:
        raise StudyError(f"{source}: the file is empty; write a study (name:, models:, series:), "
                         "see workflow/config/default.yaml")
    if not isinstance(raw, dict):
        raise StudyError(f"{source}: the file must hold a mapping (name:, models:, series:), "
                         f"not {type(raw).__name__}")
    _check_values(raw, source)
    root = _schema()
    validator = _Validator(root)
    errors = sorted(validator.iter_errors(raw), key=lambda e: (len(e.absolute_path), e.path))
    if errors:
        # the deepest error is the most specific one
        err = max(errors, key=lambda e: len(e.absolute_path))
        if err.context:
            err = max(err.context, key=lambda e: len(e.absolute_path))
        raise StudyError(f"{source}: {_message(err, root)}")
    doc = _fill_defaults(copy.deepcopy(raw), root, root)
    _check_document(doc, source)
    if folder is not None:
        _resolve_cwd(doc, folder)
    study = Study.from_validated(doc)
    _check_study(study, source)
    try:
        study.platform.site.check(trusted=trust_site, where="platform.site")
    except SiteError as e:
        raise StudyError(f"{source}: {e}") from None
    return study


def _check_document(doc: dict, source: str) -> None:
    """The rules of the series, models and workloads that the schema cannot state, on the
    document (before it is built: its errors name the file's own values)."""
    if not doc["series"] and not doc.get("tune"):
        raise StudyError(f"{source}: series: give at least one series (or a tune: section "
                         "to search a layout by measuring it)")
    if doc.get("tune") and doc["tune"]["model"] not in doc["models"]:
        m = doc["tune"]["model"]
        raise StudyError(f"{source}: tune.model: {m!r} is not defined; use one of "
                         f"{', '.join(doc['models'])}{did_you_mean(m, doc['models'])}")
    names = Counter(s["name"] for s in doc["series"])
    for i, s in enumerate(doc["series"]):
        where = f"{source}: series[{i}]"
        if names[s["name"]] > 1:
            raise StudyError(f"{where}.name: {s['name']!r} is used by more than one series; "
                             "give each series its own name")
        if s["model"] not in doc["models"]:
            raise StudyError(f"{where}.model: {s['model']!r} is not defined; "
                             f"use one of {', '.join(doc['models'])}"
                             f"{did_you_mean(s['model'], doc['models'])}")
        if s["mode"] == "strong" and "global_batch" not in s:
            raise StudyError(f"{where}.global_batch: required for mode strong "
                             "(sequences per step, fixed across the series)")
        if s["mode"] == "weak" and "global_batch" in s:
            raise StudyError(f"{where}.global_batch: not used in mode weak (it grows with DP); "
                             "remove it and set micro_batch and grad_accum")
        if "baseline" in s and s["baseline"] not in s["gpus"]:
            raise StudyError(f"{where}.baseline: {s['baseline']} is not in gpus {s['gpus']}; "
                             "pick one of the swept device counts")
    for name, m in doc["models"].items():
        if m["hidden"] % m["heads"]:
            raise StudyError(f"{source}: models.{name}.heads: {m['heads']} does not divide "
                             f"hidden {m['hidden']}; choose heads dividing hidden")
        _check_model(name, m, source)
    _check_workload(doc["workload"], f"{source}: workload")
    for i, s in enumerate(doc["series"]):
        if "workload" in s:
            _check_workload(s["workload"], f"{source}: series[{i}].workload")


def _check_study(study: Study, source: str) -> None:
    """The rules across the training, platform and predict settings of a built study."""
    t, platform = study.train, study.platform
    if t.warmup_steps >= t.steps:
        raise StudyError(f"{source}: train.warmup_steps: {t.warmup_steps} leaves no timed "
                         f"step of {t.steps}; make it smaller than train.steps")
    if platform.memory_limit_mb and platform.device != Device.CPU:
        raise StudyError(f"{source}: platform.memory_limit_mb: only for platform.device cpu "
                         "(an address-space limit breaks GPU runtimes); remove it or set "
                         "device: cpu")
    before = study.predict.before_run_max_n
    if before is not None:
        where = f"{source}: predict.before_run.calibrate_on_max_n"
        if platform.device != Device.CPU:
            raise StudyError(f"{where}: the study's own predict job runs on a CPU study only "
                             "(platform.device cpu); remove it, or run scalestudy predict "
                             "--hardware H")
        ns = sorted({n for s in study.series for n in s.gpus})
        if not any(n <= before for n in ns) or not any(n > before for n in ns):
            raise StudyError(f"{where}: {before} leaves no point to calibrate on or none to "
                             f"predict (the series sweep N = {ns}); pick a value between "
                             f"{ns[0]} and {ns[-1] - 1}")
    if platform.hardware is not None and devices.device_key(platform.hardware) is None:
        keys = ", ".join(devices.devices())
        raise StudyError(f"{source}: platform.hardware: unknown device "
                         f"{platform.hardware!r}; use one of {keys} or null")


def _check_model(name: str, m: dict, source: str) -> None:
    """The model block's own rules (``config.parts.Model``: kv_heads, the arch's options)."""
    try:
        Model(name=name, **m)
    except PointError as e:
        raise StudyError(f"{source}: {str(e).replace('model.', f'models.{name}.', 1)}") from None


def _check_workload(spec, where: str) -> None:
    """A ``workload:`` entry: a bare ``command`` has no argv, a template must be a list of
    strings with known placeholders, ``metrics: log`` needs its expressions."""
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


def _resolve_cwd(doc: dict, folder: Path) -> None:
    """Command workloads run in ``cwd`` relative to the study file's folder (default: the
    folder itself), made absolute here so the runner finds it from any directory."""
    for holder in [doc] + list(doc["series"]):
        spec = holder.get("workload")
        if isinstance(spec, dict):
            spec["cwd"] = str((folder / spec.get("cwd", ".")).resolve())


def load_study(path: str | Path, trust_site: bool = False) -> Study:
    """Read, validate and resolve a study file. Raises :class:`StudyError`."""
    path = Path(path)
    return validate(parse(read_text(path), str(path)), str(path), trust_site, path.parent)
