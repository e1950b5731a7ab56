"""Run one sweep point: start its ranks, watch them, classify the outcome, write ``status.json``.

    python -m scalestudy.runner RUN_DIR/point.json RUN_DIR

Failures are data: whatever happens to the training processes, this writes a final
``status.json`` (``ok | oom | timeout | crashed``) with a reason and evidence lines from the log,
and exits 0 so the sweep goes on. Only an interrupt of the runner itself (Ctrl-C, the job being
cancelled) leaves no status, so the point counts as not run and is rerun on resume.

Limits that turn a sick point into a classified one:

- ``platform.timeout_s``: watchdog on the whole point (the process group is killed: timeout).
- ``platform.collective_timeout_s``: the process-group timeout (``init_process_group``); a hung
  collective raises in the waiting ranks (gloo: "Timed out waiting Nms", NCCL: the watchdog's
  "collective operation timeout"): timeout.
- ``platform.memory_limit_mb`` (CPU only): ``RLIMIT_AS`` per training process, set here before
  torchrun starts, so a point that does not fit fails with the framework's own allocation error
  ("DefaultCPUAllocator: can't allocate memory"): oom.

Fault injection for tests (inert unless ``SCALESTUDY_FAULT`` is set; see :func:`parse_faults`):
``SCALESTUDY_FAULT="kill:rank=1:step=3:match=kill;hang:rank=1:step=2:match=hang"`` makes the
trainer of a matching point SIGKILL itself or sleep forever at the start of that step.

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
FAULT_ENV = "SCALESTUDY_FAULT"
FAULT_KINDS = ("kill", "hang")


def parse_faults(text: str | None) -> list[dict]:
    """Faults from ``SCALESTUDY_FAULT``: ``;``-separated ``KIND[:rank=R][:step=S][:match=SUB]``.

    ``kill``: the rank SIGKILLs itself at the start of step S (a node or process dying);
    ``hang``: the rank sleeps forever at the start of step S, so its peers wait in a collective.
    ``rank`` (global rank, default 0), ``step`` (optimizer step from 0, default 0); ``match``
    (default: every point) limits the fault to points whose ``point_id`` contains SUB."""
    faults = []
    for spec in filter(None, (t.strip() for t in (text or "").split(";"))):
        kind, *opts = spec.split(":")
        if kind not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}: unknown fault {kind!r} in {spec!r}; use one of "
                             f"{', '.join(FAULT_KINDS)}")
        fault = {"kind": kind, "rank": 0, "step": 0, "match": ""}
        for opt in opts:
            key, sep, value = opt.partition("=")
            if not sep or key not in fault or key == "kind":
                raise ValueError(f"{FAULT_ENV}: bad option {opt!r} in {spec!r}; use rank=R, "
                                 "step=S, match=SUBSTRING")
            fault[key] = value if key == "match" else int(value)
        faults.append(fault)
    return faults


def fault_for(point: dict, rank: int, environ=os.environ) -> dict | None:
    """The fault this rank of ``point`` must inject, or None (always None without the env var)."""
    for fault in parse_faults(environ.get(FAULT_ENV)):
        if fault["rank"] == rank and fault["match"] in point["point_id"]:
            return fault
    return None


def inject_fault(fault: dict | None, step: int) -> None:
    """Called by the trainer at the start of each step; acts once the fault's step is reached."""
    if fault is None or step != fault["step"]:
        return
    print(f"scalestudy fault injection: rank {fault['rank']} {fault['kind']} at step {step}",
          file=sys.stderr, flush=True)
    if fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: the peers wait in the step's collectives
        time.sleep(3600)


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
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _tail(log: Path, n: int = 40) -> list[str]:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if ln.strip()][-n:]


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def root_cause(log_lines: list[str]) -> dict | None:
    """torchrun's "Root Cause (first observed failure)" record: ``{rank, exitcode, traceback}``
    of the rank that failed first, or None when the log has none."""
    try:
        start = max(i for i, ln in enumerate(log_lines) if "Root Cause (first observed failure)" in ln)
    except ValueError:
        return None
    out: dict = {}
    for ln in log_lines[start + 1:start + 12]:
        m = re.match(r"\s*(rank|exitcode|traceback)\s*:\s*(.*)", ln)
        if m and m.group(1) not in out:
            key, value = m.groups()
            if key == "rank":
                out["rank"] = int(value.split()[0])
            elif key == "exitcode":
                out["exitcode"] = int(value.split()[0])
            else:
                out["traceback"] = value.strip()
        if ln.startswith("==="):
            break
    return out if "rank" in out else None


def classify(exit_code: int | None, timed_out: bool, log_lines: list[str],
             has_summary: bool, *, timeout_s: float | None = None,
             collective_timeout_s: float | None = None) -> tuple[str, str]:
    """(state, reason) of a finished attempt from its exit code, the watchdog and the log.

    Order: the framework's out-of-memory errors (oom), a collective that timed out (timeout),
    the runner's watchdog (timeout), success, then the first failing rank (crashed): a rank
    killed by a signal, else that rank's exception (its peers then only report a lost
    connection)."""
    text = "\n".join(log_lines)
    for pat in OOM_PATTERNS:
        if re.search(pat, text):
            line = next(ln for ln in log_lines if re.search(pat, ln)).strip()
            return "oom", f"out of memory: {line}"[:300]
    for pat in COLLECTIVE_TIMEOUT_PATTERNS:
        if re.search(pat, text):
            line = next(ln for ln in log_lines if re.search(pat, ln)).strip()
            limit = f"={collective_timeout_s:g} s" if collective_timeout_s else ""
            return "timeout", (f"collective timeout: a rank waited longer than "
                               f"platform.collective_timeout_s{limit} for its peers "
                               f"(a peer hung or died): {line}")[:300]
    if timed_out:
        limit = f"={timeout_s:g} s" if timeout_s else ""
        return "timeout", (f"watchdog: no result within platform.timeout_s{limit}; "
                           "the point's processes were killed")
    if exit_code == 0 and has_summary:
        return "ok", ""
    if exit_code == 0:
        return "crashed", "training exited 0 but wrote no summary.json"
    if exit_code is not None and exit_code < 0:
        return "crashed", f"the launcher was killed by {_signal_name(-exit_code)}"
    cause = root_cause(log_lines)
    if cause and cause.get("exitcode", 0) < 0:
        return "crashed", (f"rank {cause['rank']} was killed by "
                           f"{_signal_name(-cause['exitcode'])} (exit code {cause['exitcode']}); "
                           "the other ranks were stopped")
    # the first rank's exception is the root cause; peers then fail with "connection closed"
    rank_errors = [ln for ln in log_lines if re.match(r"\[rank\d+\]: \w+(Error|Exception)\b", ln)]
    if cause and any(ln.startswith(f"[rank{cause['rank']}]:") for ln in rank_errors):
        rank_errors = [ln for ln in rank_errors if ln.startswith(f"[rank{cause['rank']}]:")]
    errors = rank_errors or [ln for ln in log_lines if re.search(r"(Error|Exception|error:)", ln)
                             and "ChildFailedError" not in ln]  # torchrun's, not the cause
    first = errors[0].strip() if rank_errors else (errors[-1].strip() if errors else "")
    return "crashed", (first or f"exit code {exit_code}")[:300]


def _evidence(log_lines: list[str], n_tail: int = 12) -> list[str]:
    """The lines a reader needs, in log order: injected faults, out-of-memory and collective
    timeout errors, the ranks' first exceptions, torchrun's root-cause record, the log's end."""
    key = re.compile("|".join(OOM_PATTERNS + COLLECTIVE_TIMEOUT_PATTERNS) +
                     r"|fault injection|^\[rank\d+\]: \w+(Error|Exception)\b|exitcode")
    keep = {i for i, ln in enumerate(log_lines) if key.search(ln)}
    keep = set(sorted(keep)[:12])
    starts = [i for i, ln in enumerate(log_lines) if "Root Cause (first observed failure)" in ln]
    for i in starts[-1:]:
        keep.update(range(i, min(i + 8, len(log_lines))))
    keep.update(range(max(0, len(log_lines) - n_tail), len(log_lines)))
    return [log_lines[i][:500] for i in sorted(keep)]


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
    for name in RECORD_FILES:  # a previous, interrupted attempt's record is not a result
        (run_dir / name).unlink(missing_ok=True)
    for tmp in run_dir.glob(".*"):  # temp files of atomic writes cut short by a kill
        if tmp.is_file():
            tmp.unlink(missing_ok=True)
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
                                start_new_session=True, preexec_fn=memory_limit_preexec(
                                    point["platform"].get("memory_limit_mb")))
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
                             (run_dir / "summary.json").exists(),
                             timeout_s=point["platform"].get("timeout_s"),
                             collective_timeout_s=point["platform"].get("collective_timeout_s"))
    return {"state": state, "reason": reason,
            "evidence": [] if state == "ok" else _evidence(lines),
            "exit_code": proc.returncode, "started": started, "finished": _now(),
            "wall_s": round(time.monotonic() - t0, 3)}


def _runner_error(exc: Exception, started: str, t0: float) -> dict:
    """The status of an attempt the runner itself could not make (bad point.json, launch
    error): still a record, so the sweep and its tables go on."""
    import traceback
    lines = traceback.format_exception_only(type(exc), exc)
    return {"state": "crashed", "reason": f"runner error: {lines[-1].strip()}"[:300],
            "evidence": [ln.rstrip() for ln in traceback.format_exc().splitlines()][-15:],
            "exit_code": None, "started": started, "finished": _now(),
            "wall_s": round(time.monotonic() - t0, 3)}


def run_point(point_json: Path, run_dir: Path) -> dict:
    """Run a point with ``point['retries']`` extra tries for crashes and timeouts (an OOM is
    deterministic and not retried); write ``status.json`` last, atomically. Any error of the
    runner itself becomes a ``crashed`` status too; only an interrupt leaves none."""
    run_dir.mkdir(parents=True, exist_ok=True)
    history: list[dict] = []
    started, t0 = _now(), time.monotonic()
    try:
        point = read_json(point_json)
        tries = 1 + int(point.get("retries", 0))
        for _ in range(tries):
            started, t0 = _now(), time.monotonic()
            status = attempt(point, run_dir)
            history.append({k: status[k] for k in ("state", "reason", "wall_s")})
            if status["state"] not in ("crashed", "timeout"):
                break
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed
        status = _runner_error(exc, started, t0)
        history.append({k: status[k] for k in ("state", "reason", "wall_s")})
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
