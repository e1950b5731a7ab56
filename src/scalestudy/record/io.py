"""Atomic file writes: a result file is either complete or absent, never half-written, and
created with the user's umask (a group can read a shared study when the umask lets it).

Temp files are ``.<stem>.<pid>.<random><suffix>`` beside the target, one per writer;
:func:`clean_temps` removes those a killed writer left (never a live writer's).
:func:`atomic_paths` writes several files all or none: every temp first, then the renames.
A write that fails names the file it was writing (``OSError.filename``, the target, never the
temp), so :func:`os_error_line` can say which path and what to do in one line; the writers
of a study's tables and figures hold :func:`tables_lock` (``RESULTS/<study>/.tables.lock``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import sys
import tempfile
import time
from contextlib import contextmanager, suppress
from pathlib import Path

#: The lock the writers of a study's tables and figures hold (aggregate, plot), in the study
#: folder; the launcher's own lock (``.lock``, ``run.guard``) is held for its whole life.
TABLES_LOCK = ".tables.lock"
#: How long a writer waits for another writer of the same study's tables (s).
TABLES_LOCK_WAIT_S = 600.0


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
    """A new empty temp file ``.<stem>.<pid>.<random><suffix>`` beside ``path`` with the mode
    a plain ``open(path, "w")`` gives (``tempfile.mkstemp`` makes it 0600 whatever the umask).
    An OSError names ``path`` (or its folder), not the temp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.{os.getpid()}.",
                                   suffix=path.suffix)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from e
    try:
        os.fchmod(fd, 0o666 & ~umask())
    finally:
        os.close(fd)
    return Path(tmp)


def _naming(e: OSError, tmps: list[Path], targets: list[Path]) -> OSError:
    """``e`` naming the file being written: a temp's target for the temp, the target (its
    folder, for several) when the failed write named no file (``write()`` names none)."""
    if e.errno is None:  # a message of ours (FileNotFoundError("... not found: ..."))
        return e
    names = {str(t): str(p) for t, p in zip(tmps, targets)}
    if e.filename is None:
        folders = {p.parent for p in targets}
        where = str(folders.pop()) if len(targets) > 1 and len(folders) == 1 else str(targets[0])
    elif str(e.filename) in names:
        where = names[str(e.filename)]
    else:
        return e
    return OSError(e.errno, e.strerror, where)


def _discard(tmps: list[Path]) -> None:
    for tmp in tmps:
        with suppress(OSError):
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temp path beside ``path`` (same suffix, so writers pick the right format);
    rename it onto ``path`` when the block succeeds, delete it when it fails (an OSError then
    names ``path``)."""
    with atomic_paths([path]) as (tmp,):
        yield tmp


@contextmanager
def atomic_paths(paths):
    """Yield temp paths for several files; rename them all onto their targets only when the
    block succeeds (all or none: a full disk while writing leaves every old file in place;
    an OSError names the file, or the files' folder)."""
    paths = [Path(p) for p in paths]
    tmps: list[Path] = []
    try:
        for p in paths:
            tmps.append(_temp_beside(p))
        yield tmps
        for tmp, p in zip(tmps, paths):
            os.replace(tmp, p)
    except OSError as e:
        _discard(tmps)
        named = _naming(e, tmps, paths)
        if named is e:
            raise
        raise named from e
    except BaseException:
        _discard(tmps)
        raise


def _live_writer(name: str, stem: str) -> bool:
    """Whether the temp file ``name`` of ``stem`` belongs to a process alive on this host (its
    pid in the name; an older name without one: not)."""
    m = re.match(rf"\.{re.escape(stem)}\.(\d+)\.", name)
    if not m or int(m[1]) <= 1:
        return False
    try:
        os.kill(int(m[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def clean_temps(folder: str | os.PathLike, stems) -> list[Path]:
    """Remove the temp files of atomic writes of ``stems`` (e.g. ``runs``, ``efficiency``)
    in ``folder`` that a killed writer left, never one a live process on this host writes
    (call it holding :func:`tables_lock`, which covers the writers on other hosts); returns
    them."""
    out = []
    for stem in stems:
        for tmp in Path(folder).glob(f".{stem}.*"):
            if tmp.is_file() and not tmp.is_symlink() and not _live_writer(tmp.name, stem):
                tmp.unlink(missing_ok=True)
                out.append(tmp)
    return out


class TablesBusy(BlockingIOError):
    """Another writer held a study's tables lock for longer than the wait (one line)."""


@contextmanager
def tables_lock(study_dir: str | os.PathLike, wait_s: float = TABLES_LOCK_WAIT_S):
    """Hold the study's tables lock (:data:`TABLES_LOCK`, ``flock``, exclusive) for the block,
    waiting up to ``wait_s`` for another aggregate or plot of the study (said once on stderr);
    :class:`TablesBusy` after that. The kernel drops it when the holder ends, however it ends.
    A folder that does not exist is not created (its reader says what is missing)."""
    folder = Path(study_dir)
    if not folder.is_dir():
        yield
        return
    path = folder / TABLES_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        deadline, told = time.monotonic() + wait_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OSError(e.errno, e.strerror, str(path)) from e
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "owner unknown"
            if not told:
                print(f"scalestudy: waiting for another aggregate or plot of {folder} ({holder}) "
                      f"to finish writing (up to {wait_s:.0f} s)", file=sys.stderr, flush=True)
                told = True
            if time.monotonic() >= deadline:
                raise TablesBusy(f"{path}: another aggregate or plot of this study ({holder}) "
                                 f"still writes its tables after {wait_s:.0f} s; wait for it "
                                 "to end (or end it) and run again")
            time.sleep(0.1)
        with suppress(OSError):  # who holds it, for the message above (a full disk: unsaid)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


#: Per errno: what went wrong and what to do, for :func:`os_error_line`.
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on device", "free space there"),
    errno.EDQUOT: ("disk quota exceeded", "free space there (or raise the quota)"),
    errno.EACCES: ("permission denied", "make it writable (or write the results elsewhere)"),
    errno.EPERM: ("operation not permitted", "make it writable (or write the results "
                  "elsewhere)"),
    errno.EROFS: ("read-only file system", "write the results elsewhere"),
    errno.ENOTDIR: ("a part of this path is a file, not a folder", "move that file away"),
    errno.EEXIST: ("exists and is not a folder", "move it away"),
    errno.EISDIR: ("is a folder, not a file", "move it away"),
    errno.ENOENT: ("no such file or folder", "check the path"),
    errno.ELOOP: ("is a symlink", "replace it with a real file or folder"),
    errno.EIO: ("input/output error", "check the disk"),
}


def os_error_line(e: OSError) -> str:
    """One line for a failed read or write: ``<path>: <what>; <fix> and run again`` (the
    atomic writes left every earlier file whole, so the next run finishes the job). A message
    of ours (no errno) is kept as it is."""
    from scalestudy.record.bounded_read import one_line

    if e.errno is None:
        return one_line(e)
    what, fix = _OS_ERRORS.get(e.errno, (e.strerror or type(e).__name__, "check the path"))
    where = f"{os.fsdecode(e.filename)}: " if e.filename is not None else ""
    return one_line(f"{where}{what}; {fix} and run again")


class _NamedStdout:
    """Standard output whose failed writes name it (``OSError.filename``), so a full disk
    behind a redirection is said like any other file's."""

    def __init__(self, stream):
        self._stream = stream

    def _named(self, call, *args):
        try:
            return call(*args)
        except OSError as e:
            if e.filename is not None or e.errno is None:
                raise
            raise OSError(e.errno, e.strerror, "standard output") from e

    def write(self, text):
        return self._named(self._stream.write, text)

    def flush(self):
        return self._named(self._stream.flush)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_stdout() -> None:
    """Point standard output at /dev/null: what it still buffers cannot be written, and
    would fail again (with a traceback) when the interpreter exits."""
    with suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)


def exit_on_os_error(main) -> int:
    """``main()``'s exit status with its printed output flushed; an OSError (a full disk, an
    unwritable results folder, a full standard output) ends it with one line on stderr,
    ``scalestudy: error: <path>: <what>; <fix> ...``, and status 2: what each command and
    workflow rule that writes results runs."""
    stdout = sys.stdout
    sys.stdout = _NamedStdout(stdout)
    try:
        status = int(main() or 0)
        sys.stdout.flush()
        return status
    except OSError as e:
        if e.filename == "standard output":
            _drop_stdout()
        print(f"scalestudy: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    finally:
        if isinstance(sys.stdout, _NamedStdout):
            sys.stdout = stdout


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_csv(df, path: str | os.PathLike) -> Path:
    """Write a DataFrame to ``path`` as CSV (no index) atomically."""
    with atomic_path(path) as tmp:
        df.to_csv(tmp, index=False)
    return Path(path)


def write_json(path: str | os.PathLike, obj) -> Path:
    return write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike):
    """The JSON object in ``path`` (bounded, regular files only: ``record.run_records``); OSError
    when missing, ValueError when damaged."""
    from scalestudy.record.bounded_read import read_object

    data = read_object(path)
    if data is None:
        raise FileNotFoundError(f"{path}: no such file")
    return data


def read_record(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path``, or None when it is missing, damaged or not an object (a
    record not written yet, or cut short): for optional inputs only; the run records are read
    through ``scalestudy.record.run_records``, which says why."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _workload_own(rel: tuple[str, ...]) -> bool:
    """Whether a path ``rel`` inside a run folder (its parts) is the workload's: under a name
    scalestudy never writes there (``record.states.RUN_FOLDER_NAMES``)."""
    from scalestudy.record.states import RUN_FOLDER_NAMES

    return bool(rel) and rel[0] not in RUN_FOLDER_NAMES


def workload_links(run_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """The links a workload made in its run folder (not under a name scalestudy writes),
    found without following any: ``(path relative to the run folder, target)``."""
    root = Path(run_dir)
    if root.is_symlink() or not root.is_dir():
        return []
    out = []
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in sorted(dirs + files):
            p = Path(top, name)
            rel = p.relative_to(root).parts
            if p.is_symlink() and _workload_own(rel):
                out.append(("/".join(rel), os.readlink(p)))
    return out


def escaping_links(study_dir: str | os.PathLike) -> list[tuple[Path, str]]:
    """Symlinks inside ``study_dir`` whose target lies outside it: ``(link, target)``. A link
    a workload made in its run folder (a folder holding ``point.json``; not under a name
    scalestudy writes: :func:`workload_links`) is the workload's: scalestudy never follows
    nor writes through it, so it is not one."""
    root = Path(study_dir)
    if not root.is_dir():
        return []
    real = root.resolve()
    out = []
    run_dirs: list[Path] = []
    for top, dirs, files in os.walk(root, followlinks=False):
        here = Path(top)
        if "point.json" in files and not (here / "point.json").is_symlink():
            run_dirs.append(here)
        owner = next((r for r in run_dirs if here == r or here.is_relative_to(r)), None)
        for name in dirs + files:
            p = here / name
            if p.is_symlink():
                if owner is not None and _workload_own(p.relative_to(owner).parts):
                    continue
                target = os.path.realpath(p)
                if not Path(target).is_relative_to(real):
                    out.append((p, target))
    return out


def refuse_escaping_links(study_dir: str | os.PathLike) -> None:
    """RecordError (one line) when a symlink in the study folder leads outside it."""
    from scalestudy.record.bounded_read import RecordError

    bad = escaping_links(study_dir)
    if bad:
        link, target = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise RecordError(f"{link} is a symlink to {target}, outside {study_dir}{more}: "
                          "scalestudy writes only inside the results folder; remove the link "
                          "(or make it a real folder) and rerun")
