"""Run one sweep point: start its ranks, watch them, classify the outcome, write ``status.json``.

The ranks run the built-in trainer or the point's command workload (``scalestudy.run.workload``)
under the same launcher, watchdog and limits; for a command the runner also writes the record
the command does not (``env.json``, and from its metrics ``steps.jsonl`` / ``summary.json``:
``scalestudy.run.collect``); missing or foreign metrics make the run ``invalid``.

    scalestudy run-point RUN_DIR/point.json RUN_DIR          (scalestudy.commands.run_point)

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
- a memory cgroup's limit (Slurm's ``--mem`` under task/cgroup): the kernel's OOM killer
  SIGKILLs a rank; on the kernel's own word (``scalestudy.run.oomkill``): oom, with it as
  evidence.

Nothing of a point outlives it, and one training at a time writes its folder
(``scalestudy.run.lifetime``); its output goes to ``stdout.log`` through a cap
(``scalestudy.run.capture``), and its TMPDIR is ``RUN_DIR/tmp``, removed after each attempt,
as are the temp files of writes a kill cut short (:func:`clear_temps`). A link the workload
made in its folder is never followed nor written through, and the status lists it.

Deliberately light: no torch import here (start-up cost per point is torchrun's alone).
"""

from __future__ import annotations

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
from scalestudy.record.io import read_json, read_record, workload_links, write_json
from scalestudy.record.run_records import run_problem
from scalestudy.record.bounded_read import read_tail
from scalestudy.record.states import RECORD_FILES, RETRIED, RunState
from scalestudy.run import (capture, collect, health, launch, lifetime, oomkill, outcome,
                            workload)

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


def clear_temps(run_dir: Path) -> list[Path]:
    """Remove the temp files of atomic writes a killed writer left (hidden files: the records'
    ``.NAME.PID.*`` in the run folder, the traces' ``.rankN.PID.tmp.json.gz`` in
    ``traces/``), never a link or the point's lock; returns them. Called holding the point's
    lock, with no process of a launch alive, so no live writer owns one."""
    out = []
    for folder in (run_dir, run_dir / breakdown.TRACES_DIR):
        if folder.is_symlink():
            continue
        for tmp in folder.glob(".*"):
            if tmp.is_file() and not tmp.is_symlink() and tmp.name != lifetime.POINT_LOCK:
                tmp.unlink(missing_ok=True)
                out.append(tmp)
    return out


def _clear_traces(run_dir: Path, pattern: str | None) -> None:
    """Remove a previous attempt's traces (``breakdown.trace_files``), only those that lie
    inside the run folder: never a link, nor a file reached through one."""
    real = run_dir.resolve()
    for f in breakdown.trace_files(run_dir, pattern):
        if (os.path.isfile(f) and not os.path.islink(f)
                and Path(os.path.realpath(f)).is_relative_to(real)):
            os.unlink(f)


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
    clear_temps(run_dir)
    _clear_traces(run_dir, point.workload.traces)
    scratch = run_dir / SCRATCH  # TMPDIR of the launch: torchrun's log folders, ranks' temps
    if scratch.is_symlink():  # never emptied through a link
        scratch.unlink()
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
    memory = oomkill.snapshot()
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
            clear_temps(run_dir)  # no writer of the launch is left
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
    killed = None
    if state == RunState.CRASHED:  # a SIGKILL the kernel's OOM killer dealt is an oom
        killed = _kernel_oom(proc.returncode, lines, memory)
        if killed:
            state, reason = RunState.OOM, outcome.oom_reason(reason, killed)
    if state != RunState.OK and (_disk_full(run_dir) or any(NO_SPACE.search(ln) for ln in lines)):
        state, reason = RunState.CRASHED, no_space(run_dir)  # a full disk, whatever broke
    # a command's own links (its data set, an output folder elsewhere) are left as they are
    left_alone = [f"{rel} -> {target}" for rel, target in workload_links(run_dir)]
    return {"state": state, "reason": reason,
            "evidence": [] if state == RunState.OK else outcome.evidence(lines) + (
                [killed] if killed else []),
            **({"links_left_alone": left_alone} if left_alone else {}),
            "exit_code": proc.returncode, "started": started, "finished": _now(),
            "wall_s": wall, "log_cut_bytes": output.cut}


def _kernel_oom(exit_code: int | None, lines: list[str], before: oomkill.Snapshot) -> str | None:
    """The kernel's evidence that its OOM killer ended a process of the attempt
    (``outcome.kernel_oom``), the kernel log read only for a SIGKILL the cgroup did not
    count."""
    kills = oomkill.oom_kills_since(before)
    found = outcome.kernel_oom(exit_code, lines, kills, [])
    if found or not outcome.killed_by_sigkill(exit_code, lines):
        return found
    return outcome.kernel_oom(exit_code, lines, kills, oomkill.kernel_lines_since(before.t_us))


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
    a damaged trace is an empty breakdown with its reason); a command workload's that left no
    trace says so (:func:`no_trace_reason`); a run that could not write it has none, which
    the tables say."""
    why = no_trace_reason(point, run_dir)
    if not (point.profile.enabled or point.workload.traces or why):
        return
    try:
        if why:
            write_json(run_dir / breakdown.BREAKDOWN_FILE, breakdown.empty(why))
        else:
            breakdown.write_breakdown(run_dir, point.to_json(), point.workload.traces)
    except OSError as e:
        print(f"scalestudy: breakdown.json not written: {e}", file=sys.stderr)


def no_trace_reason(point: Point, run_dir: Path) -> str | None:
    """Why a command workload with profiling asked has no breakdown: it left no trace where
    ``workload.traces`` says, or the study asks ``profile.enabled`` (the built-in trainer's
    setting, read from the study's ``study.json``) and the command says nowhere where it
    traces; None otherwise."""
    if not point.workload.is_command:
        return None
    pattern = point.workload.traces
    if pattern:
        if breakdown.trace_files(run_dir, pattern):
            return None
        return (f"profiling asked (workload.traces: {pattern}), but the command left no trace "
                f"there: nothing in its run folder matches {pattern}")
    study = read_record(run_dir.parent.parent / "study.json") or {}
    profile = study.get("profile")
    if isinstance(profile, dict) and profile.get("enabled") is True:
        return ("profiling asked (profile.enabled), but a command workload traces itself and "
                "this one left no trace scalestudy can find: set workload.traces to the files "
                "its profiler writes in its run folder")
    return None


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


def cancelled(signum, _frame):
    """A cancelled job (SIGTERM from Snakemake, Slurm, or its parent's death) stops its ranks
    and writes no status. Once: a second SIGTERM (the parent-death signal comes once per
    thread) must not cut the stop short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signum)


def as_job() -> None:
    """What the runner is as a Snakemake or Slurm job's process (``scalestudy run-point
    --job``): it ends with the job's process (SIGTERM, handled as a cancel: :func:`cancelled`)
    and reaps the orphans of its launch (``scalestudy.run.lifetime``)."""
    lifetime.die_with_parent(signal.SIGTERM, os.getppid())
    lifetime.become_subreaper()

