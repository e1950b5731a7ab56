"""Node health around a point's attempts: the straggler verdict of an attempt and whether it
earns a retry, and the node check of a multi-node Slurm point (``docs/failures.md``,
"Stragglers and node health").

An ``ok`` attempt whose ranks were further out of step than ``platform.straggler_ratio``
(``scalestudy.record.stragglers``) stays ok, its data is real, but the runner spends one of
the point's ``retries`` on it: a straggler is often a passing state of a node (another job's
traffic, a throttled device), and the next attempt may not meet it. Every attempt's verdict
stays in ``status.json``'s ``attempts``.

Node check (ReFrame's way: check the nodes, then measure): before each attempt of a point on
several nodes inside a Slurm allocation, one task per node of the allocation
(:func:`check_argv`) times a matrix product on its own node
(``python -m scalestudy nodecheck``: one JSON line, the node and its FLOP/s). A node
whose rate is below the median node's divided by ``platform.straggler_ratio`` is slow
(:func:`slow_nodes`); it is excluded from the attempt (``srun --exclude``, :func:`excluded`)
when the allocation keeps enough nodes without it (:func:`exclusion`), else the attempt runs
on it and the record says so. The check's rows, the slow nodes and the exclusion are written
to ``RUN_DIR/health.json`` and copied into the attempt's entry of ``status.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median
from typing import Mapping

from scalestudy.config.point import Point
from scalestudy.record import stragglers
from scalestudy.record.io import write_json
from scalestudy.record.run_records import read_summary
from scalestudy.record.bounded_read import RecordError, is_number, read_object
from scalestudy.record.states import RunState
from scalestudy.run.slurm import cpus_per_task


def attempt_stragglers(point: Point, run_dir: Path, state: str) -> dict:
    """What an attempt's entry of ``status.json``'s ``attempts`` records of its ranks' spread:
    ``{"rank_spread": x}``, with ``"straggler": note`` when flagged; ``{}`` for an attempt
    that did not end ok or whose record has no per-rank times (one rank, a command)."""
    if state != RunState.OK:
        return {}
    summary, _ = read_summary(run_dir, point.point_id, point.config_hash)
    rec = (summary or {}).get(stragglers.SUMMARY_KEY)
    if not rec:
        return {}
    limit = float(point.platform.straggler_ratio)
    entry = {"rank_spread": round(float(rec["rank_spread"]), 4)}
    if stragglers.flagged(rec, limit):
        entry["straggler"] = stragglers.note(rec, limit)
    return entry


def retry_straggler(entry: dict) -> bool:
    """An attempt (its ``attempts`` entry) ended ok but flagged as shaped by a straggler: worth
    one of the point's retries."""
    return bool(entry.get("straggler"))


# --- the node check --------------------------------------------------------------------------

#: The node check's record in the run folder (rewritten before each checked attempt).
HEALTH_FILE = "health.json"
#: The per-node probe (``python *CHECK``: ``scalestudy nodecheck``, ``scalestudy.measure.nodecheck``).
CHECK = ("-m", "scalestudy", "nodecheck")
#: Bound on the whole check (seconds): a node that does not answer is reported, not waited on.
CHECK_TIMEOUT_S = 120.0


def needs_check(point: Point, environ: Mapping = os.environ) -> bool:
    """A point on several nodes inside a Slurm allocation (the launch is ``srun``)."""
    return point.nodes > 1 and bool(environ.get("SLURM_JOB_ID"))


def check_argv(point: Point, python: str = sys.executable) -> list[str]:
    """One probe task on every node of the allocation (srun's default: all its nodes)."""
    return ["srun", "--ntasks-per-node", "1",
            "--cpus-per-task", str(cpus_per_task(point.procs_per_node, point.platform)),
            "--kill-on-bad-exit=1", "--job-name", f"ss-check-{point.point_id}"[:64],
            python, *CHECK]


def parse_rows(stdout: str) -> list[dict]:
    """The probe's rows (``{"node": name, "flops_per_s": x}``) in its output; other lines and
    malformed rows are skipped."""
    rows = []
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("node"), str) and \
                is_number(row.get("flops_per_s")) and row["flops_per_s"] > 0:
            rows.append({"node": row["node"], "flops_per_s": float(row["flops_per_s"])})
    return rows


def slow_nodes(rows: list[dict], ratio: float) -> list[str]:
    """The nodes far below the others: a rate under the median node's / ``ratio`` (sorted;
    none with fewer than two nodes)."""
    if len(rows) < 2:
        return []
    mid = median(r["flops_per_s"] for r in rows)
    return sorted({r["node"] for r in rows if r["flops_per_s"] * ratio < mid})


def exclusion(rows: list[dict], slow: list[str], needed: int) -> tuple[list[str], str]:
    """Which slow nodes to exclude, and the line that says what was done: all of them when
    the allocation keeps ``needed`` nodes without them, else none."""
    if not slow:
        return [], ""
    nodes = {r["node"] for r in rows}
    if len(nodes - set(slow)) >= needed:
        return list(slow), f"excluded {','.join(slow)} (slow in the node check)"
    return [], (f"{','.join(slow)} slow in the node check but not excluded: the allocation's "
                f"{len(nodes)} node(s) leave fewer than the point's {needed} without it")


def check_nodes(point: Point, run_dir: Path, run=subprocess.run) -> dict:
    """Run the node check for the next attempt, write ``health.json`` and return it:
    ``rows``, ``slow``, ``exclude`` and a ``note`` (or ``error`` when the check itself
    failed: nothing excluded)."""
    record: dict = {"rows": [], "slow": [], "exclude": [], "note": ""}
    try:
        done = run(check_argv(point), capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        record["rows"] = parse_rows(done.stdout)
        if done.returncode != 0 or not record["rows"]:
            record["error"] = (f"node check exit code {done.returncode}: "
                               f"{(done.stderr or '').strip()[-300:]}")
    except (OSError, subprocess.SubprocessError) as e:
        record["error"] = f"node check failed: {e}"[:300]
    limit = float(point.platform.straggler_ratio)
    record["slow"] = slow_nodes(record["rows"], limit)
    record["exclude"], record["note"] = exclusion(record["rows"], record["slow"], point.nodes)
    write_json(Path(run_dir) / HEALTH_FILE, record)
    return record


def before_attempt(point: Point, run_dir: Path, environ: Mapping = os.environ,
                   run=subprocess.run) -> dict:
    """What the runner does before an attempt: the node check of a multi-node Slurm point
    (:func:`check_nodes`); the entry's ``{"node_check": record}`` for ``status.json``'s
    ``attempts``, ``{}`` for any other point."""
    if not needs_check(point, environ):
        (Path(run_dir) / HEALTH_FILE).unlink(missing_ok=True)  # no stale exclusion
        return {}
    return {"node_check": check_nodes(point, run_dir, run)}


def excluded(run_dir: str | os.PathLike) -> list[str]:
    """The nodes the node check excluded for this attempt (``health.json``; none when absent
    or unreadable)."""
    try:
        rec = read_object(Path(run_dir) / HEALTH_FILE)
    except RecordError:
        return []
    nodes = (rec or {}).get("exclude")
    return [n for n in nodes if isinstance(n, str) and n] if isinstance(nodes, list) else []
