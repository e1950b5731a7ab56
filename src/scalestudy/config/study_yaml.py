"""The study file as YAML: its text read within limits (``read_text``), parsed by libyaml's safe
loader with every hostile construct refused on the way (``parse``: duplicate keys, anchors and
aliases, tags, huge numbers, deep nesting, too many values), and a study built in Python
written out plainly (``dump_study``). Every problem is a :class:`StudyError` of one line
naming the file, the place and the fix."""

from __future__ import annotations

import errno
import os
import re
from enum import StrEnum
from pathlib import Path

import yaml

from scalestudy.config import limits
from scalestudy.config.checks import short
from scalestudy.config.files import ReadProblem, read_capped

#: libyaml's parser when PyYAML was built with it (the pure-Python one is ~10x slower).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class StudyError(ValueError):
    """A study file that cannot be run; ``str()`` is one line naming the field and the fix."""


PLAIN_KEY = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def place(path) -> str:
    """A field's place in the document, as a message names it (``series[0].mode``)."""
    out = ""
    for p in path:
        if isinstance(p, int) and not isinstance(p, bool):
            out += f"[{p}]"
        elif isinstance(p, str) and PLAIN_KEY.fullmatch(p):
            out += f".{p}" if out else p
        else:  # a key with odd characters: quoted, escaped, cut
            out += f"[{short(p, 40)}]"
    return out or "(top level)"


def cut(text: str, limit: int = 120) -> str:
    """Plain text cut to ``limit`` characters, on one line."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _PlainDumper(yaml.SafeDumper):
    """Writes every value out: no ``&id001`` / ``*id001`` for a list or mapping that appears
    twice in the document (PyYAML's default, which :func:`load_study` refuses)."""

    def ignore_aliases(self, data):
        return True


# a vocabulary word (a StrEnum member, as a typed study's JSON form holds it) as plain text
_PlainDumper.add_multi_representer(
    StrEnum, lambda dumper, v: dumper.represent_str(str(v)))


def dump_study(doc, **options) -> str:
    """YAML text of a study built in Python, loadable by :func:`load_study`."""
    return yaml.dump(doc, Dumper=_PlainDumper, **options)


class _DuplicateKey(ValueError):
    pass


class _UniqueKeyLoader(_YAML_LOADER):
    """libyaml's safe loader that refuses a key given twice in one mapping (plain YAML keeps the
    last one silently, so a repeated ``steps:`` would hide a typo)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, str) and key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(f"duplicate key {short(key)} at line {mark.line + 1}")
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


#: A plain scalar YAML would read as a number (int, float, hex, octal, sexagesimal).
_LONG_NUMBER = re.compile(r"[-+]?[0-9][0-9_.:eExXa-fA-FoO+-]*")


def _scan(text: str, source: str) -> None:
    """Walk the file's YAML events once (libyaml; no values built yet) and refuse what a study
    never needs before anything is built from it: anchors and aliases (an alias bomb expands a
    few lines into gigabytes), explicit tags, lists or mappings as keys, nesting deeper than
    :data:`limits.MAX_DEPTH`, more than :data:`limits.MAX_NODES` nodes or
    :data:`limits.MAX_ITEMS` entries in one list or mapping."""
    frames: list[list] = []  # per open collection: [is_mapping, children so far, last key]
    nodes = 0
    loader = _YAML_LOADER(text)
    node_events = (yaml.ScalarEvent, yaml.MappingStartEvent, yaml.SequenceStartEvent,
                   yaml.AliasEvent)

    def where(is_key: bool = False) -> str:
        # a key's own field is the mapping that holds it; a value's, its key or index
        path = [f[2] if f[0] else f[1] - 1 for f in (frames[:-1] if is_key else frames)]
        text = place(path)
        return text if len(text) <= 160 else "..." + text[-157:]

    try:
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frames.pop()
                continue
            if not isinstance(ev, node_events):
                continue
            line = ev.start_mark.line + 1
            nodes += 1
            if nodes > limits.MAX_NODES:
                raise StudyError(f"{source}: (file): more than {limits.MAX_NODES} values, line "
                                 f"{line} (at most {limits.MAX_NODES})")
            is_key = False
            if frames:
                parent = frames[-1]
                is_key = parent[0] and parent[1] % 2 == 0
                parent[1] += 1
                entries = (parent[1] + 1) // 2 if parent[0] else parent[1]
                if entries > limits.MAX_ITEMS:
                    raise StudyError(f"{source}: {where(True)}: more than {limits.MAX_ITEMS} "
                                     f"entries, line {line} (at most {limits.MAX_ITEMS})")
                if is_key and isinstance(ev, yaml.ScalarEvent):
                    parent[2] = ev.value if len(ev.value) <= 64 else ev.value[:61] + "..."
            if isinstance(ev, yaml.AliasEvent) or ev.anchor is not None:
                raise StudyError(f"{source}: {where(is_key)}: YAML anchors and aliases (&name, "
                                 f"*name) are not allowed, line {line} (write the value out; "
                                 "from Python: scalestudy.config.study.dump_study)")
            if ev.tag is not None:
                raise StudyError(f"{source}: {where(is_key)}: YAML tag {short(ev.tag)} is not "
                                 f"allowed, line {line} (plain values only: quote text)")
            if (isinstance(ev, yaml.ScalarEvent) and ev.implicit[0] and len(ev.value) > 30
                    and _LONG_NUMBER.fullmatch(ev.value)):
                raise StudyError(f"{source}: {where(is_key)}: a number of {len(ev.value)} "
                                 f"characters, line {line} (at most 2**53 = {limits.MAX_INT})")
            if is_key and not isinstance(ev, yaml.ScalarEvent):
                kind = "mapping" if isinstance(ev, yaml.MappingStartEvent) else "list"
                raise StudyError(f"{source}: {where(True)}: a {kind} as a mapping key, line "
                                 f"{line} (keys are names)")
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(frames) >= limits.MAX_DEPTH:
                    raise StudyError(f"{source}: {where()}: nested deeper than "
                                     f"{limits.MAX_DEPTH} levels, line {line} "
                                     f"(at most {limits.MAX_DEPTH})")
                frames.append([isinstance(ev, yaml.MappingStartEvent), 0, "?"])
    finally:
        loader.dispose()


def _syntax_error(source: str, e: yaml.YAMLError) -> StudyError:
    mark = getattr(e, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or (str(e).splitlines() or ["?"])[0]
    return StudyError(f"{source}: YAML syntax error{at}: {cut(problem)}; "
                      "fix the file's syntax")


def read_text(path: str | Path) -> str:
    """The text of a study file: a regular file of at most :data:`limits.MAX_FILE_BYTES`
    bytes of UTF-8. Raises :class:`StudyError`."""
    path = Path(path)
    cap = limits.MAX_FILE_BYTES
    try:
        data = read_capped(path, cap)
    except ReadProblem as e:
        raise StudyError(f"{path}: " + {
            "os": f"cannot read the study file ({e.detail}); check the path",
            "folder": "(file): a folder (a YAML study file)",
            "special": "(file): not a regular file (a YAML study file)",
            "swapped": "(file): not a regular file (a YAML study file)",
            "size": f"(file): {e.detail} bytes is too large (at most {cap} bytes)",
            "grew": f"(file): more than {cap} bytes (at most {cap} bytes)"}[e.kind]) from None
    if data is None:
        raise StudyError(f"{path}: cannot read the study file ({os.strerror(errno.ENOENT)}); "
                         "check the path")
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise StudyError(f"{path}: (file): UTF-16 text (save the file as UTF-8 text)")
    nul = data.find(b"\0")
    if nul >= 0:
        raise StudyError(f"{path}: (file): a binary file (NUL byte at offset {nul}) "
                         "(a YAML text file, UTF-8)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise StudyError(f"{path}: (file): byte 0x{data[e.start]:02x} at line {line} is not "
                         "UTF-8 (save the file as UTF-8 text)") from None


def parse(text: str, source: str = "study"):
    """The YAML value of a study file's text, within :mod:`~scalestudy.config.limits`, with
    duplicate keys refused. Raises :class:`StudyError`."""
    try:
        _scan(text, source)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except StudyError:
        raise
    except _DuplicateKey as e:
        raise StudyError(f"{source}: {e}; keep one of them") from None
    except yaml.YAMLError as e:
        raise _syntax_error(source, e) from None
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as e:
        # what libyaml accepts but Python cannot build, e.g. an integer of 5000 digits
        text = str(e)
        raise StudyError(f"{source}: (file): a value could not be read ({type(e).__name__}: "
                         f"{cut(text)}) (plain YAML values)") from None
