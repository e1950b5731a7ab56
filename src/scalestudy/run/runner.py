"""Run one sweep point: start its ranks, watch them, classify the outcome, write ``status.json``.

The ranks run the built-in trainer or the point's command workload (``scalestudy.run.workload``)
under the same launcher, watchdog and limits; for a command the runner also writes the record
the command does not (``env.json``, and from its metrics ``steps.jsonl`` / ``summary.json``:
``scalestudy.run.collect``); missing or foreign metrics make the run ``invalid``.

    python -m scalestudy.run.runner RUN_DIR/point.json RUN_DIR

Failures are data: whatever happens to the training processes, this writes a final
``status.json`` (``ok | oom | timeout | crashed | invalid``) with a reason and evidence lines from the log
(``scalestudy.run.outcome``), and exits 0 so the sweep goes on. Only an interrupt of the runner
itself (Ctrl-C, the job being cancelled) leaves no status, so the point counts as not run and is
rerun on resume.

Limits that turn a sick point into a classified one:

- ``platform.timeout_s``: watchdog on the whole point (the process group is killed: timeout).
- ``platform.collective_timeout_s``: the process-group timeout (``init_process_group``); a hung
  collective raises in the waiting ranks (gloo: "Timed out waiting Nms", NCCL: the watchdog's
  "collective operation timeout"): timeout.
- ``platform.memory_limit_mb`` (CPU only): ``RLIMIT_AS`` per training process, set here before
  torchrun starts, so a point that does not fit fails with the framework's own allocation error
  ("DefaultCPUAllocator: can't allocate memory"): oom.

Nothing of a point outlives it, and one training at a time writes its folder
(``scalestudy.run.lifetime``); its output goes to ``stdout.log`` through a cap
(``scalestudy.run.capture``), and its TMPDIR is ``RUN_DIR/tmp``, removed after each attempt.

Deliberately light: no torch import here (start-up cost per point is torchrun's alone).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from scalestudy.config import sitepolicy
from scalestudy.config.point import Point
from scalestudy.record import trace_terms as breakdown
from scalestudy.record.io import read_json, write_json
from scalestudy.record.read import run_problem
from scalestudy.record.reading import read_tail
from scalestudy.record.states import RECORD_FILES, RETRIED, RunState
from scalestudy.run import capture, collect, health, launch, lifetime, outcome, workload

_TERM_GRACE_S = 10.0
#: The launch's TMPDIR in the run folder (removed after each attempt): every file a point
#: writes lands under results/, torchrun's log folders too.
SCRATCH = "tmp"


def memory_limit_preexec(limit_mb: float | None):
    """A ``preexec_fn`` that caps the address space (``RLIMIT_AS``) of torchrun and its ranks
    (inherited per process) at ``limit_mb`` MB, or None for no limit."""
    if not limit_mb:
        return None
    limit = int(limit_mb * 2**20)

    def preexec():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return preexec


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _tail(log: Path, n: int = 40) -> list[str]:
    """The last ``n`` non-blank lines of the log (its last MiB: bounded whatever it holds)."""
    lines = read_tail(log).splitlines()
    return [ln for ln in lines if ln.strip()][-n:]


#: How a full file system shows in a log (Python's OSError, C's strerror).
NO_SPACE = re.compile(r"No space left on device|\bENOSPC\b|\[Errno 28\]")


def no_space(path: str | os.PathLike) -> str:
    """The reason of a point that could not write (ENOSPC)."""
    return f"no space left on device ({path})"


def _disk_full(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 64 * 1024


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the launch's process group (torchrun stops its ranks on it, srun its step), then
    SIGKILL it (the ranks die with torchrun: ``scalestudy.run.lifetime``)."""
    for sig, wait in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        if not lifetime.kill_group(proc.pid, sig):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _end_launch(proc: subprocess.Popen, keep: set[int]) -> None:
    """Whatever the attempt's end, no process of it outlives it: the launch stopped if it still
    runs, what is left of its process group (a command's background child) and the orphans
    re-parented to this runner (``lifetime.become_subreaper``) killed; ``keep``: this
    process's children from before the launch."""
    if proc.poll() is None:
        _kill_group(proc)
    lifetime.kill_group(proc.pid)
    lifetime.end_orphans(keep)


def _launch(argv: list[str], env: dict, point: Point, out_fd: int,
            lock_fd: int | None) -> subprocess.Popen:
    """Start the launch in a session of its own (its process group is the point's), its
    output into ``out_fd``, dying with this runner, holding the point's lock."""
    plat = point.platform
    return subprocess.Popen(
        argv, stdout=out_fd, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        cwd=point.workload.cwd if point.workload.is_command else None,
        pass_fds=() if lock_fd is None else (lock_fd,),
        preexec_fn=lifetime.dies_with_parent(signal.SIGTERM,
                                             then=memory_limit_preexec(plat.memory_limit_mb)))


def attempt(point: Point, run_dir: Path, lock_fd: int | None = None) -> dict:
    """One try: launch, wait with the watchdog, classify. Returns the status dict.
    ``lock_fd``: the point's lock (``lifetime.hold_point``), handed down to the ranks."""
    for name in RECORD_FILES:  # a previous, interrupted attempt's record is not a result
        (run_dir / name).unlink(missing_ok=True)
    for tmp in run_dir.glob(".*"):  # temp files of atomic writes cut short by a kill
        if tmp.is_file() and tmp.name != lifetime.POINT_LOCK:
            tmp.unlink(missing_ok=True)
    breakdown.clear_traces(run_dir, point.workload.traces)
    scratch = run_dir / SCRATCH  # TMPDIR of the launch: torchrun's log folders, ranks' temps
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    argv = launch.launch_argv(point, run_dir)
    added = {**launch.env_additions(point, os.environ), **workload.command_env(point, run_dir)}
    env = {**launch.launch_env(point, os.environ), **added, "TMPDIR": str(scratch)}
    if lock_fd is not None:
        env[lifetime.POINT_LOCK_FD_ENV] = str(lock_fd)
    # the records (stdout.log, env.json) get the command line and environment with secrets
    # redacted; the processes get the real values
    shown_argv = sitepolicy.redact_argv(argv, sitepolicy.secrets_from(os.environ))
    shown = shlex.join(shown_argv)
    env["SCALESTUDY_COMMAND"] = shown
    command = point.workload.is_command
    log = run_dir / "stdout.log"
    plat = point.platform
    started, t0 = _now(), time.monotonic()
    timed_out = False
    keep = lifetime.children()
    with open(log, "wb") as out:
        out.write(f"$ {shown}\n".encode())
        out.flush()
        read_fd, write_fd = os.pipe()
        try:
            proc = _launch(argv, env, point, write_fd, lock_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        output = capture.CappedLog(read_fd, out).start()
        try:
            proc.wait(timeout=float(plat.timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # interrupted too: stop the ranks, leave no status (rerun later)
            _end_launch(proc, keep)
            output.join(timeout=_TERM_GRACE_S)
    shutil.rmtree(scratch, ignore_errors=True)
    wall = round(time.monotonic() - t0, 3)
    lines = _tail(log, 200)
    invalid = None
    if command:  # the runner writes the record the command does not (scalestudy.run.collect)
        collect.write_env(point, run_dir, shown_argv, sitepolicy.redact_environ(added))
        if proc.returncode == 0 and not timed_out:
            invalid = collect.command_record(point, run_dir, log, wall)
    if invalid:
        state, reason = RunState.INVALID, invalid
    else:
        state, reason = outcome.classify(proc.returncode, timed_out, lines,
                                         (run_dir / "summary.json").exists(),
                                         timeout_s=plat.timeout_s,
                                         collective_timeout_s=plat.collective_timeout_s)
        if state == RunState.OK and not command:  # the records checked against the point
            invalid = run_problem(run_dir, point.to_json())
            if invalid:
                state, reason = RunState.INVALID, invalid
    if state != RunState.OK and (_disk_full(run_dir) or any(NO_SPACE.search(ln) for ln in lines)):
        state, reason = RunState.CRASHED, no_space(run_dir)  # a full disk, whatever broke
    return {"state": state, "reason": reason,
            "evidence": [] if state == RunState.OK else outcome.evidence(lines),
            "exit_code": proc.returncode, "started": started, "finished": _now(),
            "wall_s": wall, "log_cut_bytes": output.cut}


def _runner_error(exc: Exception, started: str, t0: float) -> dict:
    """The status of an attempt the runner itself could not make (bad point.json, launch
    error): still a record, so the sweep and its tables go on."""
    import traceback
    lines = traceback.format_exception_only(type(exc), exc)
    return {"state": RunState.CRASHED, "reason": f"runner error: {lines[-1].strip()}"[:300],
            "evidence": [ln.rstrip() for ln in traceback.format_exc().splitlines()][-15:],
            "exit_code": None, "started": started, "finished": _now(),
            "wall_s": round(time.monotonic() - t0, 3)}


def run_point(point_json: Path, run_dir: Path) -> dict:
    """Run a point with ``point.retries`` extra tries for crashes, timeouts and ok runs shaped
    by a straggler (``scalestudy.run.health``; an OOM is deterministic and not retried); write ``status.json`` last, atomically. Any error of the
    runner itself (an unreadable point.json, a launch error) becomes a ``crashed`` status too;
    only an interrupt leaves none. Holds the point's lock throughout (:class:`lifetime.PointBusy`
    when a previous training of the point does not end within ``POINT_LOCK_WAIT_S``)."""
    run_dir = Path(run_dir).resolve()  # absolute: a command may run in another folder
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_fd = lifetime.hold_point(run_dir)
    try:
        return _tries(point_json, run_dir, lock_fd)
    finally:
        os.close(lock_fd)


def _tries(point_json: Path, run_dir: Path, lock_fd: int) -> dict:
    """:func:`run_point`'s attempts and its ``status.json``."""
    history: list[dict] = []
    started, t0 = _now(), time.monotonic()
    try:
        point = Point.from_json(read_json(point_json), str(point_json))
        for _ in range(1 + point.retries):
            started, t0 = _now(), time.monotonic()
            checked = health.before_attempt(point, run_dir)
            status = attempt(point, run_dir, lock_fd)
            history.append({k: status[k] for k in ("state", "reason", "wall_s")} | checked
                           | health.attempt_stragglers(point, run_dir, status["state"]))
            if status["state"] not in RETRIED and not health.retry_straggler(history[-1]):
                break
    except OSError as exc:
        status = _runner_error(exc, started, t0)
        if exc.errno == errno.ENOSPC or _disk_full(run_dir):
            status["reason"] = no_space(exc.filename or run_dir)
        history.append({k: status[k] for k in ("state", "reason", "wall_s")})
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed
        status = _runner_error(exc, started, t0)
        history.append({k: status[k] for k in ("state", "reason", "wall_s")})
    status["attempts"] = history
    if status["state"] == RunState.OK:
        _write_breakdown(point, run_dir)
    write_status(run_dir, status)
    return status


def _write_breakdown(point: Point, run_dir: Path) -> None:
    """A profiled run's ``breakdown.json`` from its traces (``scalestudy.record.trace_terms``:
    a damaged trace is an empty breakdown with its reason); a run that could not write it
    has none, which the tables say."""
    if not (point.profile.enabled or point.workload.traces):
        return
    try:
        breakdown.write_breakdown(run_dir, point.to_json(), point.workload.traces)
    except OSError as e:
        print(f"scalestudy: breakdown.json not written: {e}", file=sys.stderr)


def write_status(run_dir: Path, status: dict) -> None:
    """Write ``status.json``; on a full disk make room by emptying this attempt's
    ``stdout.log`` (its evidence lines are in the status) and try once more (OSError when
    even that fails)."""
    try:
        write_json(run_dir / "status.json", status)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        log = run_dir / "stdout.log"
        if log.is_file() and not log.is_symlink():
            os.truncate(log, 0)
        status["reason"] = status["reason"] or no_space(run_dir)
        write_json(run_dir / "status.json", status)


def _cancelled(signum, _frame):
    """A cancelled job (SIGTERM from Snakemake, Slurm, or its parent's death) stops its ranks
    and writes no status. Once: a second SIGTERM (the parent-death signal comes once per
    thread) must not cut the stop short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _cancelled)
    ap = argparse.ArgumentParser(
        prog="scalestudy run-point", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one sweep point, as each training job of the Snakemake DAG does: start\n"
                    "its ranks, watch them, classify the outcome and write status.json (ok, oom,\n"
                    "timeout, crashed or invalid, with the reason). Exits 0 once status.json is\n"
                    "written, whatever the point did: a failed point is data.",
        epilog="example:\n"
               "  scalestudy run-point results/default/runs/ID/point.json results/default/runs/ID")
    ap.add_argument("point_json", help="the point's point.json (written by the plan)")
    ap.add_argument("run_dir", help="its run folder, results/<study>/runs/<point id>")
    args = ap.parse_args(argv)
    argv = [args.point_json, args.run_dir]
    study_dir = Path(argv[1]).absolute().parent.parent
    if Path(argv[1]).is_symlink() or not Path(argv[1]).resolve().is_relative_to(study_dir.resolve()):
        print(f"scalestudy: error: {argv[1]} is a symlink leading outside {study_dir}: "
              "nothing written there; remove the link and rerun", file=sys.stderr)
        return 2
    try:
        status = run_point(Path(argv[0]), Path(argv[1]))
    except lifetime.PointBusy as e:
        print(f"scalestudy: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scalestudy: interrupted: {argv[1]} left without a status (it reruns)",
              file=sys.stderr)
        return 130
    except OSError as e:  # not even status.json could be written
        print(f"scalestudy: error: {argv[1]}: status.json not written: "
              f"{no_space(argv[1]) if e.errno == errno.ENOSPC else e}", file=sys.stderr)
        return 1
    print(f"{Path(argv[1]).name}: {status['state']} {status['reason']}".rstrip())
    return 0


def as_job() -> None:
    """What the runner is as a Snakemake or Slurm job's process (``python -m
    scalestudy.run.runner``): it ends with the job's process (SIGTERM, handled as a cancel) and
    reaps the orphans of its launch (``scalestudy.run.lifetime``); :func:`main` handles the
    SIGTERM."""
    lifetime.die_with_parent(signal.SIGTERM, os.getppid())
    lifetime.become_subreaper()


if __name__ == "__main__":
    as_job()
    sys.exit(main())
