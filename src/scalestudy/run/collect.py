"""What the runner records for a command workload, which writes no ``summary.json`` or
``env.json`` of its own: ``env.json`` (the command template, its expanded argv, the launch
line, the host), and after a clean exit the canonical ``steps.jsonl`` (warm-up flagged) and
``summary.json`` (``scalestudy.record.run_summary``, the built-in trainer's keys), from

- ``steps_jsonl``: the ``steps.jsonl`` the command wrote into ``$SCALESTUDY_POINT_DIR``
  (``scalestudy.record.steps``: the contract; ``scalestudy.train.metrics.StepLogger``: the
  helper), or
- a log parser over ``stdout.log`` (``scalestudy.run.logparse``: the ``megatron`` and
  ``torchtitan`` presets or the study's own expressions).

Metrics that are missing, unparseable or not the point's (another step count or batch) make
the run ``invalid`` with the reason: never a silent zero. No torch import unless the device
must be asked for its name.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import socket
from pathlib import Path

from scalestudy.config.point import Point
from scalestudy.config.vocab import Device, MetricsFormat
from scalestudy.config.devices import cpu_name
from scalestudy.record.run_summary import summary
from scalestudy.record.env import common_env
from scalestudy.record.io import write_json
from scalestudy.record.run_records import parse_steps, read_steps
from scalestudy.record.bounded_read import RecordError, read_text
from scalestudy.record.against_point import point_facts, step_vs_point
from scalestudy.record.steps import STEPS_FILE, write_steps
from scalestudy.run import logparse, workload


def device_facts(point: Point) -> tuple[str, str | None]:
    """``(device_type, device_name)`` the command ran on: the platform's device; for ``auto``
    and ``cuda`` torch is asked (the only torch import of the runner)."""
    if point.platform.device == Device.CPU:
        return "cpu", cpu_name()
    try:
        import torch

        if torch.cuda.is_available():
            return "cuda", torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - a missing or broken torch: the platform's word
        pass
    return ("cpu", cpu_name()) if point.platform.device == Device.AUTO else ("cuda", None)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_env_record(point: Point, run_dir: Path, argv: list[str], env_added: dict) -> dict:
    """``env.json`` of a command workload: what ran (template, expanded argv, working folder,
    the launch line and the environment it added) and where."""
    device_type, device_name = device_facts(point)
    return {
        "workload": workload.describe(point, run_dir),
        "command": shlex.join(argv), "launch_argv": list(argv), "env_added": env_added,
        "torch": _version("torch"), "backend": None, "device_type": device_type,
        "device_name": device_name, "world_size": point.n,
        "hosts": [socket.gethostname()],
        "slurm": {k: v for k, v in os.environ.items() if k.startswith("SLURM_")},
        **common_env(point),
    }


def write_env(point: Point, run_dir: Path, argv: list[str], env_added: dict) -> None:
    write_json(run_dir / "env.json", command_env_record(point, run_dir, argv, env_added))


def steps_from_jsonl(point: Point, run_dir: Path) -> tuple[list[dict], str | None]:
    """The command's ``steps.jsonl``, checked against the point: one line per optimizer step
    (``train.steps`` of them), the point's tokens per step, and where a record carries them
    (optional keys) the point's ``global_batch`` and ``seq_len``; warm-up flagged by
    position."""
    path = run_dir / STEPS_FILE
    try:
        text = read_text(path)  # bounded, regular files only
    except RecordError as e:
        return [], str(e)
    if text is None:
        return [], (f"the command wrote no {STEPS_FILE} into ${workload.POINT_DIR_ENV} "
                    "(use scalestudy.train.metrics.StepLogger, or declare a log parser: "
                    "workload.metrics)")
    records, problem = parse_steps(text, STEPS_FILE)
    if problem:
        return records, problem
    steps, warm = point.train.steps, point.train.warmup_steps
    if len(records) != steps:
        return records, (f"{STEPS_FILE} has {len(records)} steps, the point trains {steps}: "
                         "pass {steps} to the command")
    facts = point_facts(point.to_json())  # the reader's one check of a line vs the point
    problem = next(filter(None, (step_vs_point(r, facts, STEPS_FILE) for r in records)), None)
    if problem:
        return records, (f"{problem}: the command does not run the point's batch (pass "
                         "{global_batch}/{micro_batch}/{seq_len})")
    for i, r in enumerate(records):
        r["warmup"] = i < warm
    return records, None


def steps_from_log(point: Point, log: Path) -> tuple[list[dict], str | None, str | None]:
    """``(records, problem, memory_note)`` of a log-parsed command: the logged steps checked
    against the point (its batch, sequence length and step count wherever the log prints them:
    ``logparse.parse_log``), and why the peak memory is empty where the log says it is unmeasured."""
    w = point.workload
    patterns = w.patterns if w.metrics == MetricsFormat.LOG else logparse.PRESETS[w.metrics]
    name = str(w.metrics)
    try:
        with open(log, errors="replace") as f:
            found, facts = logparse.read_log(f, patterns)
    except OSError as e:
        return [], f"stdout.log cannot be read ({e.strerror})", None
    problem = logparse.check_facts(facts, global_batch=point.global_batch,
                                   seq_len=point.seq_len, steps=point.train.steps, name=name)
    if problem:
        return [], problem, None
    records, problem = logparse.to_steps(
        found, n=point.n, seq_len=point.seq_len, tokens_per_step=point.tokens_per_step,
        warmup_steps=point.train.warmup_steps, steps=point.train.steps, name=name)
    return records, problem, logparse.unmeasured(found)


def command_record(point: Point, run_dir: Path, log: Path, wall_s: float) -> str | None:
    """Read a cleanly finished command's metrics and write ``steps.jsonl`` and
    ``summary.json``; returns None, or why the run is ``invalid``."""
    memory_note = None
    if point.workload.metrics == MetricsFormat.STEPS_JSONL:
        records, problem = steps_from_jsonl(point, run_dir)
    else:
        records, problem, memory_note = steps_from_log(point, log)
    if problem:
        return f"metrics: {problem}"[:300]
    write_steps(run_dir / STEPS_FILE, records)
    # every source (steps.jsonl or a log preset) meets the one reader's contract, the
    # point's step count included, or the run is invalid
    _, problem = read_steps(run_dir / STEPS_FILE, point.train.steps)
    if problem:
        return f"metrics: {problem}"[:300]
    device_type, device_name = device_facts(point)
    peaks = [r["peak_memory_bytes"] for r in records if r.get("peak_memory_bytes") is not None]
    kind = {MetricsFormat.TORCHTITAN: "torchtitan_max_reserved"}.get(point.workload.metrics,
                                                                    "reported_by_command")
    write_json(run_dir / "summary.json", summary(
        point, records, device_type=device_type, device_name=device_name,
        peak_memory_bytes=max(peaks) if peaks else None, memory_kind=kind if peaks else None,
        train_wall_s=wall_s, metrics=str(point.workload.metrics),
        metrics_reads=logparse.READS.get(str(point.workload.metrics)),
        **({"memory_note": memory_note} if memory_note and not peaks else {})))
    return None
