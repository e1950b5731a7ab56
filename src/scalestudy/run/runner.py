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

Deliberately light: no torch import here (start-up cost per point is torchrun's alone).
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from scalestudy.config import sitepolicy
from scalestudy.config.point import Point
from scalestudy.record.io import read_json, write_json
from scalestudy.record.read import read_tail
from scalestudy.record.states import RECORD_FILES, RETRIED, RunState
from scalestudy.run import collect, launch, outcome, workload

_TERM_GRACE_S = 10.0


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
    """SIGTERM the whole process group (torchrun and its ranks), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def attempt(point: Point, run_dir: Path) -> dict:
    """One try: launch, wait with the watchdog, classify. Returns the status dict."""
    for name in RECORD_FILES:  # a previous, interrupted attempt's record is not a result
        (run_dir / name).unlink(missing_ok=True)
    for tmp in run_dir.glob(".*"):  # temp files of atomic writes cut short by a kill
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
    argv = launch.launch_argv(point, run_dir)
    added = {**launch.env_additions(point, os.environ), **workload.command_env(point, run_dir)}
    env = {**launch.launch_env(point, os.environ), **added}
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
    with open(log, "w") as out:
        out.write(f"$ {shown}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, cwd=point.workload.cwd if command else None,
                                preexec_fn=memory_limit_preexec(plat.memory_limit_mb))
        try:
            proc.wait(timeout=float(plat.timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # interrupted: stop the ranks, leave no status (rerun later)
            _kill_group(proc)
            raise
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
    if state != RunState.OK and (_disk_full(run_dir) or any(NO_SPACE.search(ln) for ln in lines)):
        state, reason = RunState.CRASHED, no_space(run_dir)  # a full disk, whatever broke
    return {"state": state, "reason": reason,
            "evidence": [] if state == RunState.OK else outcome.evidence(lines),
            "exit_code": proc.returncode, "started": started, "finished": _now(),
            "wall_s": wall}


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
    """Run a point with ``point.retries`` extra tries for crashes and timeouts (an OOM is
    deterministic and not retried); write ``status.json`` last, atomically. Any error of the
    runner itself (an unreadable point.json, a launch error) becomes a ``crashed`` status too;
    only an interrupt leaves none."""
    run_dir = Path(run_dir).resolve()  # absolute: a command may run in another folder
    run_dir.mkdir(parents=True, exist_ok=True)
    history: list[dict] = []
    started, t0 = _now(), time.monotonic()
    try:
        point = Point.from_json(read_json(point_json), str(point_json))
        for _ in range(1 + point.retries):
            started, t0 = _now(), time.monotonic()
            status = attempt(point, run_dir)
            history.append({k: status[k] for k in ("state", "reason", "wall_s")})
            if status["state"] not in RETRIED:
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
    write_status(run_dir, status)
    return status


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A cancelled job (SIGTERM from Snakemake or Slurm) stops its ranks and writes no status.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
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
    except OSError as e:  # not even status.json could be written
        print(f"scalestudy: error: {argv[1]}: status.json not written: "
              f"{no_space(argv[1]) if e.errno == errno.ENOSPC else e}", file=sys.stderr)
        return 1
    print(f"{Path(argv[1]).name}: {status['state']} {status['reason']}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
