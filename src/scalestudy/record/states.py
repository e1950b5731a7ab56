"""The run record contract: the files of a point's run folder and the states a run ends in.

``results/<study>/runs/<point_id>/``: ``point.json`` (the point), ``steps.jsonl`` (one line per
optimizer step), ``summary.json``, ``env.json``, ``status.json`` (written last by the runner:
state, reason, evidence, exit code, times) and ``stdout.log``.
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    """How a planned run ended (``status.json``'s ``state``; ``runs.csv``'s ``status``)."""

    OK = "ok"
    OOM = "oom"  # the framework's out-of-memory error
    TIMEOUT = "timeout"  # a hung collective or the watchdog
    CRASHED = "crashed"  # a rank died or raised
    INFEASIBLE = "infeasible"  # the planner rejected it: no job
    INVALID = "invalid"  # a record that cannot be read, or metrics missing
    NOT_RUN = "not_run"  # planned, no status.json yet


#: States of a run that started and failed.
FAILED = (RunState.OOM, RunState.TIMEOUT, RunState.CRASHED)
#: States the runner retries (an out-of-memory error is deterministic).
RETRIED = (RunState.CRASHED, RunState.TIMEOUT)

#: The files of one run folder; the runner writes status.json last (and, for a profiled run,
#: breakdown.json from its traces/ just before).
RECORD_FILES = ("steps.jsonl", "summary.json", "env.json", "status.json", "stdout.log",
                "breakdown.json")
#: Every name scalestudy writes in a run folder (the records, ``point.json``, the built-in
#: trainer's ``traces/``, the launch's ``tmp/``, the point's lock); anything else there is the
#: workload's own (a command's data link, its outputs), never followed nor written through.
RUN_FOLDER_NAMES = frozenset(("point.json", *RECORD_FILES, "health.json", "traces", "tmp",
                              ".point.lock"))
