"""Atomic file writes: a result file is either complete or absent, never half-written, and
created with the user's umask (a group can read a shared study when the umask lets it).

Temp files are ``.<stem>.<random><suffix>`` beside the target; :func:`clean_temps` removes
those a killed writer left. :func:`atomic_paths` writes several files all or none: every
temp first, then the renames.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it (Linux ``/proc``), else set and restored."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _temp_beside(path: Path) -> Path:
    """A new empty temp file beside ``path`` with the mode a plain ``open(path, "w")`` gives
    (``tempfile.mkstemp`` makes it 0600 whatever the umask)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    try:
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    return Path(tmp)


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path beside ``path`` (same suffix, so writers pick the right format);
    rename it onto ``path`` when the block succeeds, delete it when it fails."""
    path = Path(path)
    tmp = _temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_paths(paths):
    """Yield temp paths for several files; rename them all onto their targets only when the
    block succeeds (all or none: a full disk while writing leaves every old file in place)."""
    paths = [Path(p) for p in paths]
    tmps: list[Path] = []
    try:
        for p in paths:
            tmps.append(_temp_beside(p))
        yield tmps
        for tmp, p in zip(tmps, paths):
            os.replace(tmp, p)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise


def clean_temps(folder: str | os.PathLike, stems) -> list[Path]:
    """Remove the temp files of atomic writes of ``stems`` (e.g. ``runs``, ``efficiency``)
    in ``folder`` that a killed writer left; returns them."""
    out = []
    for stem in stems:
        for tmp in Path(folder).glob(f".{stem}.*"):
            if tmp.is_file() and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)
                out.append(tmp)
    return out


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json(path: str | os.PathLike, obj) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike):
    """The JSON object in ``path`` (bounded, regular files only: ``record.read``); OSError
    when missing, ValueError when damaged."""
    from scalestudy.record.read import read_object

    data = read_object(path)
    if data is None:
        raise FileNotFoundError(f"{path}: no such file")
    return data


def read_record(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path``, or None when it is missing, damaged or not an object (a
    record not written yet, or cut short): for optional inputs only; the run records are read
    through ``scalestudy.record.read``, which says why."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def escaping_links(study_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """Symlinks inside ``study_dir`` whose target lies outside it: ``(link, target)``."""
    root = Path(study_dir)
    if not root.is_dir():
        return []
    real = root.resolve()
    out = []
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            p = Path(top, name)
            if p.is_symlink():
                target = os.path.realpath(p)
                if not Path(target).is_relative_to(real):
                    out.append((p, target))
    return out


def refuse_escaping_links(study_dir: str | os.PathLike) -> None:
    """RecordError (one line) when a symlink in the study folder leads outside it."""
    from scalestudy.record.read import RecordError

    bad = escaping_links(study_dir)
    if bad:
        link, target = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise RecordError(f"{link} is a symlink to {target}, outside {study_dir}{more}: "
                          "scalestudy writes only inside the results folder; remove the link "
                          "(or make it a real folder) and rerun")
