"""Run one sweep point: start its ranks, watch them, classify the outcome, write ``status.json``.

    python -m scalestudy.runner RUN_DIR/point.json RUN_DIR

Failures are data: whatever happens to the training processes, this writes a final
``status.json`` (``ok | oom | timeout | crashed``) with a reason and evidence lines from the log,
and exits 0 so the sweep goes on. Only an interrupt of the runner itself (Ctrl-C, the job being
cancelled) leaves no status, so the point counts as not run and is rerun on resume.

Deliberately light: no torch import here (start-up cost per point is torchrun's alone).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from scalestudy import launch
from scalestudy.io import read_json, write_json

RECORD_FILES = ("steps.jsonl", "summary.json", "env.json", "status.json", "stdout.log")
# Each pattern is a framework's own error text, not a guess from the exit code.
OOM_PATTERNS = (
    r"torch\.OutOfMemoryError", r"CUDA out of memory", r"HIP out of memory",
    r"DefaultCPUAllocator: can't allocate memory", r"std::bad_alloc", r"\bMemoryError\b",
    r"Cannot allocate memory",
)
COLLECTIVE_TIMEOUT_PATTERNS = (
    r"Timed out waiting \d+ms", r"Watchdog caught collective operation timeout",
    r"DistBackendError.*[Tt]imed? ?out", r"wait timeout after \d+ms",
)
FAILED_STATES = ("oom", "timeout", "crashed")
_TERM_GRACE_S = 10.0


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _tail(log: Path, n: int = 40) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def classify(exit_code: int | None, timed_out: bool, log_lines: list[str],
             has_summary: bool) -> tuple[str, str]:
    """(state, reason) of a finished attempt from its exit code and log."""
    text = "\n".join(log_lines)
    if timed_out:
        return "timeout", "watchdog: the point exceeded platform.timeout_s and was killed"
    for pat in OOM_PATTERNS:
        m = re.search(pat, text)
        if m:
            return "oom", f"out of memory ({m.group(0)})"
    for pat in COLLECTIVE_TIMEOUT_PATTERNS:
        m = re.search(pat, text)
        if m:
            return "timeout", f"collective timeout ({m.group(0)})"
    if exit_code == 0 and has_summary:
        return "ok", ""
    if exit_code == 0:
        return "crashed", "training exited 0 but wrote no summary.json"
    if exit_code is not None and exit_code < 0:
        return "crashed", f"killed by signal {signal.Signals(-exit_code).name}"
    # the first rank's exception is the root cause; peers then fail with "connection closed"
    rank_errors = [ln for ln in log_lines if re.match(r"\[rank\d+\]: \w+(Error|Exception)\b", ln)]
    errors = rank_errors or [ln for ln in log_lines if re.search(r"(Error|Exception|error:)", ln)]
    first = errors[0].strip() if rank_errors else (errors[-1].strip() if errors else "")
    return "crashed", (first or f"exit code {exit_code}")[:300]


def _evidence(log_lines: list[str]) -> list[str]:
    key = [ln for ln in log_lines
           if re.search("|".join(OOM_PATTERNS + COLLECTIVE_TIMEOUT_PATTERNS) +
                        r"|Error|Exception|Signal|signal|exitcode", ln)]
    seen, out = set(), []
    for ln in key[-8:] + log_lines[-15:]:
        if ln not in seen:
            seen.add(ln)
            out.append(ln[:500])
    return out


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


def attempt(point: dict, run_dir: Path) -> dict:
    """One try: launch, wait with the watchdog, classify. Returns the status dict."""
    for name in RECORD_FILES:
        (run_dir / name).unlink(missing_ok=True)
    argv = launch.launch_argv(point, run_dir)
    env = {**os.environ, **launch.launch_env(point, os.environ)}
    env["SCALESTUDY_COMMAND"] = shlex.join(argv)
    log = run_dir / "stdout.log"
    started, t0 = _now(), time.monotonic()
    timed_out = False
    with open(log, "w") as out:
        out.write(f"$ {shlex.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            proc.wait(timeout=float(point["platform"]["timeout_s"]))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        except BaseException:  # interrupted: stop the ranks, leave no status (rerun later)
            _kill_group(proc)
            raise
    lines = _tail(log, 200)
    state, reason = classify(proc.returncode, timed_out, lines,
                             (run_dir / "summary.json").exists())
    return {"state": state, "reason": reason,
            "evidence": [] if state == "ok" else _evidence(lines),
            "exit_code": proc.returncode, "started": started, "finished": _now(),
            "wall_s": round(time.monotonic() - t0, 3)}


def run_point(point_json: Path, run_dir: Path) -> dict:
    """Run a point with ``point['retries']`` extra tries for crashes and timeouts (an OOM is
    deterministic and not retried); write ``status.json`` last, atomically."""
    point = read_json(point_json)
    run_dir.mkdir(parents=True, exist_ok=True)
    tries = 1 + int(point.get("retries", 0))
    history = []
    for i in range(tries):
        status = attempt(point, run_dir)
        history.append({k: status[k] for k in ("state", "reason", "wall_s")})
        if status["state"] not in ("crashed", "timeout"):
            break
    status["attempts"] = history
    write_json(run_dir / "status.json", status)
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # A cancelled job (SIGTERM from Snakemake or Slurm) stops its ranks and writes no status.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    if len(argv) != 2:
        print("usage: python -m scalestudy.runner POINT_JSON RUN_DIR", file=sys.stderr)
        return 2
    status = run_point(Path(argv[0]), Path(argv[1]))
    print(f"{Path(argv[1]).name}: {status['state']} {status['reason']}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
