"""What became of a finished attempt: its state, the reason and the evidence, from the exit
code, the watchdog and the log. Each pattern is a framework's own error text, never a guess
from an exit code.

Order: the framework's out-of-memory errors (oom), a collective that timed out (timeout),
the runner's watchdog (timeout), success, then the first failing rank (crashed): a rank
killed by a signal, else that rank's exception (its peers then only report a lost
connection)."""

from __future__ import annotations

import re
import signal

from scalestudy.record.states import RunState

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


def signal_name(code: int) -> str:
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
             collective_timeout_s: float | None = None) -> tuple[RunState, str]:
    """(state, reason) of a finished attempt from its exit code, the watchdog and the log.

    Order: the framework's out-of-memory errors (oom), a collective that timed out (timeout),
    the runner's watchdog (timeout), success, then the first failing rank (crashed): a rank
    killed by a signal, else that rank's exception (its peers then only report a lost
    connection)."""
    text = "\n".join(log_lines)
    for pat in OOM_PATTERNS:
        if re.search(pat, text):
            line = next(ln for ln in log_lines if re.search(pat, ln)).strip()
            return RunState.OOM, f"out of memory: {line}"[:300]
    for pat in COLLECTIVE_TIMEOUT_PATTERNS:
        if re.search(pat, text):
            line = next(ln for ln in log_lines if re.search(pat, ln)).strip()
            limit = f"={collective_timeout_s:g} s" if collective_timeout_s else ""
            return RunState.TIMEOUT, (f"collective timeout: a rank waited longer than "
                               f"platform.collective_timeout_s{limit} for its peers "
                               f"(a peer hung or died): {line}")[:300]
    if timed_out:
        limit = f"={timeout_s:g} s" if timeout_s else ""
        return RunState.TIMEOUT, (f"watchdog: no result within platform.timeout_s{limit}; "
                           "the point's processes were killed")
    if exit_code == 0 and has_summary:
        return RunState.OK, ""
    if exit_code == 0:
        return RunState.CRASHED, "training exited 0 but wrote no summary.json"
    if exit_code is not None and exit_code < 0:
        return RunState.CRASHED, f"the launcher was killed by {signal_name(-exit_code)}"
    cause = root_cause(log_lines)
    if cause and cause.get("exitcode", 0) < 0:
        return RunState.CRASHED, (f"rank {cause['rank']} was killed by "
                           f"{signal_name(-cause['exitcode'])} (exit code {cause['exitcode']}); "
                           "the other ranks were stopped")
    # the first rank's exception is the root cause; peers then fail with "connection closed"
    rank_errors = [ln for ln in log_lines if re.match(r"\[rank\d+\]: \w+(Error|Exception)\b", ln)]
    if cause and any(ln.startswith(f"[rank{cause['rank']}]:") for ln in rank_errors):
        rank_errors = [ln for ln in rank_errors if ln.startswith(f"[rank{cause['rank']}]:")]
    errors = rank_errors or [ln for ln in log_lines if re.search(r"(Error|Exception|error:)", ln)
                             and "ChildFailedError" not in ln]  # torchrun's, not the cause
    first = errors[0].strip() if rank_errors else (errors[-1].strip() if errors else "")
    return RunState.CRASHED, (first or f"exit code {exit_code}")[:300]


def evidence(log_lines: list[str], n_tail: int = 12) -> list[str]:
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
