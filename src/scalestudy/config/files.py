"""Reading a file that may be hostile, within a size cap: the one core of the study file's
reader (:func:`scalestudy.config.study.read_text`) and the records' (:func:`scalestudy.record.
read.read_bytes`), each of which words the problems in its own style.

Only a regular file is opened (a FIFO or device could hang the reader or never end), opened
non-blocking and checked again after the open (a file swapped in between), and never more than
``cap + 1`` bytes are read (a file that grows while it is read is caught, not followed).
"""

from __future__ import annotations

import os
import stat


class ReadProblem(Exception):
    """Why a file was not read. ``kind``: ``"os"`` (``detail``: the OS's words), ``"folder"``,
    ``"special"`` (a FIFO, device or socket), ``"swapped"`` (not a regular file any more once
    opened), ``"size"`` (``detail``: its size in bytes, over the cap) or ``"grew"`` (more than
    the cap once read)."""

    def __init__(self, kind: str, detail=None):
        super().__init__(kind, detail)
        self.kind, self.detail = kind, detail


def read_capped(path: str | os.PathLike, cap: int) -> bytes | None:
    """The bytes of the regular file ``path``, at most ``cap`` of them; None when it does not
    exist. Raises :class:`ReadProblem`."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ReadProblem("os", e.strerror) from None
    if not stat.S_ISREG(st.st_mode):
        raise ReadProblem("folder" if stat.S_ISDIR(st.st_mode) else "special")
    if st.st_size > cap:
        raise ReadProblem("size", st.st_size)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ReadProblem("os", e.strerror) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat
            raise ReadProblem("swapped")
        chunks, left = [], cap + 1
        while left > 0:
            b = os.read(fd, min(left, 2**20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as e:
        raise ReadProblem("os", e.strerror) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > cap:
        raise ReadProblem("grew")
    return data
