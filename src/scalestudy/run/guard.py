"""What every launcher of a study does before it runs a point (``scalestudy run``, ``snakemake``
from the repository root, an installed package: they all parse ``workflow/Snakefile``, where
``scalestudy.run.workflow.workflow_setup`` calls :func:`claim_study`).

- **One lock per study**: ``results/<study>/.lock``, held with ``fcntl.flock`` (exclusive,
  non-blocking) for the launcher's whole life, so two launchers of the same study never train
  a point twice, whatever their ``.snakemake`` folders. The kernel drops the lock when the
  process ends, however it ends: a killed launcher leaves no stale lock. The file holds the
  owner's pid, host and start time, for the refusal's one line. ``scalestudy run`` takes it
  before Snakemake starts and hands it down (:data:`LOCK_FD_ENV`), so two launchers started
  at the same instant cannot both pass; a launcher refused in the Snakefile (plain
  ``snakemake``) ends with the same one line, exit status 2.
- **Nothing written outside the results folder**: a symlink in the study folder (a run
  folder, ``figures/``, a record) that leads outside it is refused with one line.
- **One study file per results folder**: a folder another study file with the same ``name:``
  made (``study.json``'s ``source``) is refused with one line (``record.source``).
- **Snakemake's stale locks are cleared**: its lock files that name the study's files, left by
  a killed launcher (the holder of the study's lock knows no other is alive), are removed and
  the user told, so a rerun after any kill needs no ``--unlock``.
- **A damaged ``status.json`` is rerun**: it is removed, so Snakemake sees the point as not
  run.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

from scalestudy.record.io import refuse_escaping_links
from scalestudy.record.run_records import damaged_status
from scalestudy.record.source import refuse_other_source
from scalestudy.run.lifetime import try_lock

LOCK_FILE = ".lock"


class StudyLocked(RuntimeError):
    """Another launcher runs the study (one line)."""


#: The environment variable through which a launcher that holds a study's lock hands its
#: descriptor to the Snakemake it starts (the Snakefile's claim then takes no second lock).
LOCK_FD_ENV = "SCALESTUDY_STUDY_LOCK_FD"


def locked_message(study_dir: str | os.PathLike) -> str:
    """The one line of a refused launcher: who holds the study (pid, host, since when) and
    how to wait for it or free it."""
    path = Path(study_dir) / LOCK_FILE
    who = holder(path)
    m = re.match(r"pid (\d+)(?: on (\S+))?", who)
    stop = (f"or stop it (kill {m[1]}{f' on {m[2]}' if m[2] else ''}): the lock is released "
            "when its holder ends, however it ends" if m else "or stop it")
    return (f"study {Path(study_dir).name} is being run by another launcher ({who}); wait for "
            f"it to finish (flock {path} true) {stop}, then run the same command again")


def _inherited_lock(path: Path, environ=os.environ) -> int | None:
    """The study lock's descriptor a parent launcher handed down (:data:`LOCK_FD_ENV`), when
    it is open on ``path`` and its lock is ours; else None."""
    try:
        fd = int(environ.get(LOCK_FD_ENV, ""))
        held, here = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except (ValueError, OSError):
        return None
    if (held.st_dev, held.st_ino) != (here.st_dev, here.st_ino):
        return None
    try:  # the same open file description: granted when its lock is the parent's (ours)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return None
    return fd


def lock_study(study_dir: str | os.PathLike) -> int:
    """Take the study's lock; returns its file descriptor (keep it open: closing it, or the
    process ending, releases the lock). A lock a parent launcher holds and handed down
    (:data:`LOCK_FD_ENV`) is taken as ours. Raises :class:`StudyLocked` when held."""
    study_dir = Path(study_dir)
    study_dir.mkdir(parents=True, exist_ok=True)
    path = study_dir / LOCK_FILE
    fd = _inherited_lock(path)
    if fd is not None:
        return fd
    fd = try_lock(path)
    if fd is None:
        raise StudyLocked(locked_message(study_dir)) from None
    os.ftruncate(fd, 0)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode())
    return fd


def holder(lock_path: str | os.PathLike) -> str:
    """Who holds a study's lock, from its file ("pid N on HOST since T")."""
    try:
        with open(lock_path, errors="replace") as f:
            return f.read(200).strip() or "owner unknown"
    except OSError:
        return "owner unknown"


def is_locked(study_dir: str | os.PathLike) -> bool:
    """Whether a launcher holds the study's lock now (probes with a shared, non-blocking
    lock, released at once)."""
    path = Path(study_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def rerun_damaged(study_dir: str | os.PathLike, point_ids) -> list[str]:
    """Remove each damaged ``status.json`` of the planned points (unparseable, empty, of
    wrong types), so the launcher reruns them; returns one line per point removed."""
    runs = Path(study_dir) / "runs"
    try:
        present = set(os.listdir(runs))
    except OSError:
        return []
    out = []
    for pid in point_ids:
        if pid not in present:
            continue
        why = damaged_status(runs / pid)
        if why:
            (runs / pid / "status.json").unlink(missing_ok=True)
            out.append(f"{pid}: {why}: removed, the point reruns")
    return out


def stale_snakemake_locks(study_dir: str | os.PathLike,
                          workdir: str | os.PathLike = ".") -> list[Path]:
    """Snakemake's lock files (``WORKDIR/.snakemake/locks/N.{input,output}.lock``, one path a
    line) that name a file of ``study_dir``. Called by the holder of the study's lock, they are
    stale: only a launcher of this study locks its files, and none other is alive (a killed
    one left them)."""
    locks = Path(workdir) / ".snakemake" / "locks"
    study = Path(study_dir).resolve()
    try:
        files = sorted(p for p in locks.iterdir() if p.name.endswith(".lock") and p.is_file())
    except OSError:
        return []
    stale = []
    for lock in files:
        try:
            paths = lock.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if any((Path(workdir) / p.strip()).resolve().is_relative_to(study)
               for p in paths if p.strip()):
            stale.append(lock)
    return stale


def claim_study(study_dir: str | os.PathLike, point_ids, source: str | None = None,
                study_json: dict | None = None) -> int:
    """The launcher's start: refuse escaping symlinks and a folder another study file made
    (``source``, ``study_json``: the study file and its study; ``record.source``), take the
    lock, clear Snakemake's stale locks of the study and damaged statuses (each removal
    printed on stderr). Returns the lock's descriptor."""
    refuse_escaping_links(study_dir)
    if source is not None:
        refuse_other_source(study_dir, source, study_json)
    fd = lock_study(study_dir)
    stale = stale_snakemake_locks(study_dir)
    for lock in stale:
        lock.unlink(missing_ok=True)
    if stale:
        print(f"scalestudy: removed Snakemake's stale lock ({', '.join(p.name for p in stale)} in "
              f"{stale[0].parent.resolve()}): a killed run of study {Path(study_dir).name} left "
              "it, and no launcher of the study is running", file=sys.stderr)
    for line in rerun_damaged(study_dir, point_ids):
        print(f"scalestudy: {line}", file=sys.stderr)
    return fd
