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


def _failure_records(lines: list[str]) -> list[dict]:
    """The ``[N]:`` records of a torchrun report's section: ``{rank, exitcode, pid, time,
    traceback}`` as each says them."""
    out: list[dict] = []
    for ln in lines:
        if re.match(r"\s*\[\d+\]:\s*$", ln):
            out.append({})
            continue
        m = re.match(r"\s*(rank|exitcode|traceback|time)\s*:\s*(.*)", ln)
        if not m or not out or m.group(1) in out[-1]:
            continue
        key, value = m.groups()
        if key == "rank":
            out[-1]["rank"] = int(value.split()[0])
        elif key == "exitcode":
            out[-1]["exitcode"] = int(value.split()[0])
            pid = re.search(r"\(pid: (\d+)\)", value)
            if pid:
                out[-1]["pid"] = int(pid[1])
        else:
            out[-1][key] = value.strip()
    return [r for r in out if "rank" in r and "exitcode" in r]


def root_cause(log_lines: list[str]) -> dict | None:
    """The rank that failed first, from torchrun's report: ``{rank, exitcode, traceback}``
    (and ``pid``, ``time`` where it says them), or None when the log has none.

    torchrun's "Root Cause (first observed failure)" is the first failure it saw, ordered by
    rank among those it saw in the same poll (its ``time``, to the second). A rank killed by
    a signal (not SIGTERM: torchrun stops the other ranks with it) that it saw no later than
    that root cause is taken instead: its peers' exceptions ("Connection closed by peer")
    follow from its death, and they can end within the same poll."""
    try:
        start = max(i for i, ln in enumerate(log_lines) if "Root Cause (first observed failure)" in ln)
    except ValueError:
        return None
    end = next((i for i in range(start + 1, len(log_lines))
                if log_lines[i].startswith("===")), len(log_lines))
    cause = _failure_records(log_lines[start + 1:end])
    if not cause:
        return None
    cause = cause[0]
    begin = max((i for i in range(start) if log_lines[i].strip() == "Failures:"), default=start)
    signaled = [r for r in _failure_records(log_lines[begin + 1:start])
                if r["exitcode"] < 0 and r["exitcode"] != -signal.SIGTERM  # (torchrun's stop)
                and r.get("time", "") <= cause.get("time", "")]
    if cause["exitcode"] >= 0 and signaled:
        return min(signaled, key=lambda r: (r.get("time", ""), r["rank"]))
    return cause


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


#: Slurm's own word that the kernel OOM-killed a task of a step or job: slurmstepd's line in
#: the step's output (task/cgroup), and the job state ``OUT_OF_MEMORY`` (sacct, squeue).
SLURM_OOM_PATTERNS = (r"Detected \d+ oom[-_ ]kill events?", r"\bOUT_OF_MEMORY\b")
#: The kernel OOM killer's line in the kernel log (mm/oom_kill.c), with the victim's pid.
KERNEL_KILLED = re.compile(r"(?:Out of memory|Memory cgroup out of memory).*?"
                           r"Killed process (\d+)|oom_reaper: reaped process (\d+)")


def killed_by_sigkill(exit_code: int | None, log_lines: list[str]) -> list[int | None]:
    """The processes of the launch that died by SIGKILL: the launcher itself (None) or the
    pid torchrun names for its root-cause rank (None when it names none); empty when none
    did."""
    if exit_code == -signal.SIGKILL:
        return [None]
    cause = root_cause(log_lines)
    if cause and cause.get("exitcode") == -signal.SIGKILL:
        return [cause.get("pid")]
    return []


def kernel_oom(exit_code: int | None, log_lines: list[str], cgroup_kills: tuple[int, str] | None,
               kernel_lines: list[str]) -> str | None:
    """The evidence that the kernel's OOM killer ended a process of the attempt, or None.

    ``cgroup_kills``: the memory cgroup's ``(new OOM kills, "FILE: oom_kill A -> B")`` during
    the attempt (``scalestudy.run.oomkill``), None where unreadable; ``kernel_lines``: the
    kernel log since the attempt started (empty where unreadable). Slurm's own line in the
    log is evidence alone; otherwise a process must have died by SIGKILL, and the cgroup's
    count grown or the kernel log name the killed pid (any OOM kill, when the pid is
    unknown)."""
    for pat in SLURM_OOM_PATTERNS:
        line = next((ln for ln in log_lines if re.search(pat, ln)), None)
        if line:
            return f"Slurm: {line.strip()}"
    killed = killed_by_sigkill(exit_code, log_lines)
    if not killed:
        return None
    if cgroup_kills and cgroup_kills[0] > 0:
        return f"memory cgroup {cgroup_kills[1]}"
    for ln in kernel_lines:
        m = KERNEL_KILLED.search(ln)
        if m and (None in killed or int(m[1] or m[2]) in killed):
            return f"kernel log: {ln.strip()}"
    return None


def oom_reason(crashed: str, evidence_line: str) -> str:
    """The reason of an attempt the kernel's OOM killer ended (``crashed``: the reason it had
    read as a crash)."""
    return (f"out of memory: the kernel's OOM killer ended it ({evidence_line}); "
            f"{crashed}")[:300]


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
