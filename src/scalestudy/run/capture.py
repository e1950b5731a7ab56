"""A point's ``stdout.log``, bounded: the launch's output (torchrun and every rank, stdout and
stderr) copied from a pipe into the log, keeping its first :data:`HEAD_BYTES` and its last
:data:`TAIL_BYTES`; what lies between is cut, the cut marked in the log and counted in
``status.json`` (``log_cut_bytes``). The log stays live while the point runs (``scalestudy
status`` reads its end) and never holds more than head + marker + 2 x tail bytes. When the
log cannot be written (a full disk) the pipe is closed, so the launch's next write fails as it
would on the file, and the point ends as a full disk does (``runner.no_space``)."""

from __future__ import annotations

import os
import threading

#: What ``stdout.log`` keeps of a launch's output: its first and its last bytes.
HEAD_BYTES = 8 << 20
TAIL_BYTES = 8 << 20
_CHUNK = 1 << 16


def cut_marker(cut: int) -> bytes:
    """The line that stands in ``stdout.log`` for ``cut`` bytes of output left out."""
    return (f"\n[scalestudy: {cut} bytes of output cut here; stdout.log keeps the first "
            f"{HEAD_BYTES} and the last {TAIL_BYTES} bytes]\n").encode()


class CappedLog:
    """Copies a pipe's read end into an open, binary, appending log file on a thread of its
    own: :meth:`start`, then :meth:`join` once the writers are gone; :attr:`cut` counts the
    bytes left out (0: the log holds the whole output)."""

    def __init__(self, read_fd: int, log, head: int | None = None, tail: int | None = None):
        self.read_fd, self.log = read_fd, log
        self.head = HEAD_BYTES if head is None else head
        self.tail = TAIL_BYTES if tail is None else tail
        self.cut = 0
        self.error: Exception | None = None  # the write that failed (the pipe was closed)
        self._kept = 0  # bytes of output in the log past its first ``head``
        self._ring = bytearray()  # the last ``tail`` bytes past the head
        self._start = log.tell()  # the log's own first lines (the command line) stay
        self._thread = threading.Thread(target=self._copy, name="stdout.log", daemon=True)

    def start(self) -> "CappedLog":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the end of the output; False if a writer still holds the pipe."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _copy(self) -> None:
        try:
            while chunk := os.read(self.read_fd, _CHUNK):
                self._write(chunk)
        except (OSError, ValueError) as e:  # a full disk: the pipe closes, and the writers
            self.error = e                  # fail on it as on the file (a full disk is data)
        finally:
            os.close(self.read_fd)

    def _write(self, chunk: bytes) -> None:
        log = self.log
        room = self.head - (log.tell() - self._start) if not (self._kept or self.cut) else 0
        if room > 0:
            log.write(chunk[:room])
            chunk = chunk[room:]
        if chunk:
            self._ring += chunk
            del self._ring[:max(0, len(self._ring) - self.tail)]
            log.write(chunk)
            self._kept += len(chunk)
            if self._kept > 2 * self.tail:  # rewrite the end: the marker, then the tail
                self.cut += self._kept - len(self._ring)
                log.truncate(self._start + self.head)
                log.seek(self._start + self.head)
                log.write(cut_marker(self.cut))
                log.write(self._ring)
                self._kept = len(self._ring)
        log.flush()
