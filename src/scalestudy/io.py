"""Atomic file writes: a result file is either complete or absent, never half-written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` via a temp file in the same folder + ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: str | os.PathLike, obj) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike):
    with open(path) as f:
        return json.load(f)
