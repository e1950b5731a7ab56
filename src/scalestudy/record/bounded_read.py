"""Reading a run record within bounds, and the value checks every record reader shares.

Reads are bounded: regular files only (a FIFO, a device or a folder is refused without being
opened for reading: ``os.stat`` first, then ``O_NONBLOCK`` and ``fstat`` on the open
descriptor), at most :data:`MAX_BYTES` bytes, text must be UTF-8, JSON has no NaN or Infinity
literals. A record that cannot be used is a :class:`RecordError`: one line naming the file and
what is wrong. ``scalestudy.record.run_records`` reads each record through these.
"""

from __future__ import annotations

import json
import math
import os
import stat

from scalestudy.config.files import ReadProblem, read_capped

#: Size caps (bytes) per record; a larger file is damaged, not read. steps.jsonl: about 256
#: bytes a line for the schema's 1,000,000 steps.
MAX_BYTES = {"steps.jsonl": 256 * 2**20, "plan.tsv": 64 * 2**20}
MAX_JSON_BYTES = 16 * 2**20  # status, summary, point, env, calibration, study


class RecordError(ValueError):
    """A record that cannot be used: one line, the file and what is wrong."""


def one_line(e: BaseException | str) -> str:
    """An error message on one line, without terminal control characters."""
    return printable(str(e)).replace("\n", " ")


_CONTROL = None


def printable(text: str) -> str:
    """``text`` with ANSI escape sequences and other control characters (tab and newline
    kept) removed: safe to print on a terminal."""
    global _CONTROL
    import re

    if _CONTROL is None:
        _CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|"
                              r"\x1b.?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
    return _CONTROL.sub("", text)


def read_bytes(path: str | os.PathLike, max_bytes: int | None = None) -> bytes | None:
    """The bytes of the regular file ``path``, None when it does not exist. Raises
    :class:`RecordError` for a FIFO, device, socket or folder (never opened for reading, so
    a FIFO cannot hang the reader), a file larger than ``max_bytes`` or an OS error."""
    path = os.fspath(path)  # (strings, not Path: this runs for every record of every run)
    name = os.path.basename(path)
    cap = max_bytes or MAX_BYTES.get(name, MAX_JSON_BYTES)
    try:
        return read_capped(path, cap)
    except ReadProblem as e:
        raise RecordError(f"{name}: " + {
            "os": f"cannot be read ({e.detail})",
            "folder": "not a regular file (a FIFO, device or folder): not read",
            "special": "not a regular file (a FIFO, device or folder): not read",
            "swapped": "not a regular file: not read",
            "size": f"{e.detail} bytes, more than the {cap} a sound record holds: not read",
            "grew": f"more than {cap} bytes: not read"}[e.kind]) from None


def read_text(path: str | os.PathLike, max_bytes: int | None = None) -> str | None:
    """:func:`read_bytes` decoded as UTF-8 (None: no file)."""
    data = read_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"{os.path.basename(os.fspath(path))}: not UTF-8 text (byte {e.start})") from None


def read_tail(path: str | os.PathLike, n_bytes: int = 1 << 20) -> str:
    """The last ``n_bytes`` of a log (regular files only; "" when missing or unreadable),
    undecodable bytes replaced."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return ""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - n_bytes), os.SEEK_SET)
        return os.read(fd, n_bytes).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # (one, not one per record)


def read_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path`` (None: no file); :class:`RecordError` when it is not
    one (empty, cut, not UTF-8, NaN/Infinity literals, another JSON type)."""
    text = read_text(path)
    if text is None:
        return None
    name = os.path.basename(os.fspath(path))
    if not text.strip():
        raise RecordError(f"{name}: empty")
    try:
        data = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{name}: not JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{name}: a JSON {type(data).__name__}, not an object")
    return data


# --- value checks ----------------------------------------------------------------------------


def is_number(x) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def positive(x) -> bool:
    """A finite number > 0."""
    return is_number(x) and x > 0


def check_field(rec: dict, name: str, field: str, ok, what: str, optional: bool = True) -> None:
    if field not in rec or (optional and rec[field] is None):
        if not optional:
            raise RecordError(f"{name}: no {field}")
        return
    if not ok(rec[field]):
        raise RecordError(f"{name}: {field} {show(rec[field])} is not {what}")


def show(x) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def nonneg(x) -> bool:
    return is_number(x) and x >= 0


def is_text(x) -> bool:
    return isinstance(x, str)
