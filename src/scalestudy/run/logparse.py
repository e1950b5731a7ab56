"""Per-step metrics from a trainer's log, for trainers that cannot write ``steps.jsonl``.

A parser is a set of named regular expressions (the study's ``metrics: {log: {...}}``, or a
shipped preset); each expression's first group is the number (``,`` thousands separators
allowed). Over every line of ``stdout.log``, with ANSI colour codes removed:

- ``line``: only lines matching it are read (without it: lines where a step-time or
  throughput expression matches);
- ``step``: the optimizer step (iteration) number, counted from 1 (without it the read lines
  are numbered 1, 2, ...);
- step time, from the first of ``step_time_s``, ``step_time_ms``, ``tokens_per_s`` (all
  ranks) or ``tokens_per_s_per_device`` that matches (a throughput becomes a time through the
  step's tokens);
- ``loss``; ``tokens`` (per optimizer step, all ranks) or ``samples`` (sequences per step:
  tokens = samples × the point's seq_len); without either the point's tokens per step are
  taken;
- ``peak_memory_gib``: a negative value is the trainer saying it has no memory statistics
  (torchtitan prints ``memory: -0.00GiB(-100.00%)`` on a device without them): unmeasured,
  left empty with the reason (:data:`UNMEASURED_MEMORY`), never a zero.

What the trainer says about the run as a whole, read on *every* line (a header line, or the
step line itself) and checked against the point wherever it matches (:func:`check_facts`);
any disagreement makes the run ``invalid`` with the reason:

- ``global_batch`` (sequences per optimizer step), ``seq_len`` (tokens per sequence),
  ``total_steps`` (the optimizer steps the trainer was told to run).

The logged steps themselves must end at the point's step count: the last logged step number
(or, without a ``step`` expression, the number of logged lines) equals ``train.steps``.

A logged line may stand for several steps (a log interval: Megatron's ``--log-interval``,
torchtitan's ``metrics.log_freq``): its step time is the trainer's average over the interval,
and it is one sample of the steady state. A line whose interval holds a warm-up step (the
point's ``train.warmup_steps``) is warm-up. Several ranks logging the same step: the slowest
rank's line is kept (a figure the trainer printed, not re-timed here; the built-in trainer,
which has every rank's own time, takes their mean: ``record.steps.rank_step_time``). Log
every step (interval 1) for per-step samples.

Shipped presets (``metrics: megatron`` / ``metrics: torchtitan``), each tested on real log
lines (``tests/unit/test_logparse.py`` names the sources):

- :data:`MEGATRON` reads Megatron-LM's ``training_log`` line (``megatron/training.py``,
  ``megatron/training/training.py`` from core_v0.6.0), every version from 23.04 (and v2.6)
  through core_v0.19.0: the optional ``[timestamp]`` prefix (core_v0.6+, with microseconds
  from core_v0.16), ``throughput per GPU``, ``energy``/``power``, ``skipped samples`` and
  ``num zeros`` fields. Step time is ``elapsed time per iteration (ms)``; the loss is ``lm
  loss`` (GPT pretraining); tokens are ``global batch size`` × seq_len, checked against the
  point; ``total_steps`` is the ``/ N`` of ``iteration I/ N``; the arguments Megatron prints
  at start-up (``global_batch_size ....... 1024``, ``seq_length ....... 4096``,
  ``train_iters ....... 5000``) are checked too. Megatron-DeepSpeed's line has the same fields
  and reads alike.
- :data:`TORCHTITAN` reads torchtitan's ``MetricsProcessor.log`` step line, v0.1.0 through
  v0.2.2 and main (``grad_norm`` from v0.2.0, ``loss`` with 5 decimals from v0.2.2, ``mfu:
  N/A`` on main, colours or not, ``[rank0]:`` prefixes); validation lines are skipped.
  ``tps`` is tokens per second per device (torchtitan divides by tp·pp·cp), so the step time
  is tokens per step / (tps × N); memory is ``max_reserved`` GiB. The start-up line
  ``Trainer is initialized with local batch size B, global batch size G, gradient accumulation
  steps A, sequence length S, total steps T (warmup W)`` (v0.2.x; 0.3.0 prints it alike)
  gives the global batch, the sequence length and the step count. Run live in CI: v0.2.2 on
  CPU processes (``tests/integration/test_foreign.py``); v0.3.x cannot train on a CPU (its attention has
  no CPU backward).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Mapping

from scalestudy.number_format import plain
from scalestudy.record.steps import step_record

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The quantities a parser may name, besides ``line``.
QUANTITIES = ("step", "step_time_s", "step_time_ms", "tokens_per_s", "tokens_per_s_per_device",
              "loss", "tokens", "samples", "peak_memory_gib", "global_batch", "seq_len",
              "total_steps")
#: What the trainer says about the whole run, read on every line, checked against the point.
FACTS = ("global_batch", "seq_len", "total_steps")
#: Why a negative logged memory is left empty.
UNMEASURED_MEMORY = ("the trainer logs a negative peak memory ({value:.2f} GiB): it has no memory "
                     "statistics on this device; unmeasured, not zero")
#: Expressions that make a line a logged step when there is no ``line`` expression.
TIMING = ("step_time_s", "step_time_ms", "tokens_per_s", "tokens_per_s_per_device")
_NUM = r"([-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"

MEGATRON: dict[str, str] = {
    "line": r"\biteration\s+\d+\s*/\s*\d+\s*\|",
    "step": r"\biteration\s+(\d+)\s*/",
    "step_time_ms": r"\belapsed time per iteration \(ms\):\s*" + _NUM,
    "loss": r"\|\s*lm loss:\s*" + _NUM,
    "samples": r"\bglobal batch size:\s*(\d+)",
    # the step line's "/ N", or the printed argument: the same number
    "total_steps": r"\biteration\s+\d+\s*/\s*(\d+)\s*\||\btrain_iters \.{3,} (\d+)\s*$",
    "global_batch": r"\bglobal_batch_size \.{3,} (\d+)\s*$",
    "seq_len": r"\bseq_length \.{3,} (\d+)\s*$",
}

TORCHTITAN: dict[str, str] = {
    "line": r"^(?!.*\bvalidate step:).*\bstep:\s*\d+\s+loss:.*\btps:",
    "step": r"\bstep:\s*(\d+)",
    "loss": r"\bloss:\s*" + _NUM,
    "tokens_per_s_per_device": r"\btps:\s*([\d,]+)",
    "peak_memory_gib": r"\bmemory:\s*" + _NUM + r"\s*GiB",
    "global_batch": r"\bTrainer is initialized with .*\bglobal batch size (\d+)",
    "seq_len": r"\bTrainer is initialized with .*\bsequence length (\d+)",
    "total_steps": r"\bTrainer is initialized with .*\btotal steps (\d+)",
}

PRESETS: dict[str, dict[str, str]] = {"megatron": MEGATRON, "torchtitan": TORCHTITAN}
#: What each preset reads, by version (recorded in summary.json as ``metrics_reads``).
READS: dict[str, str] = {
    "megatron": "Megatron-LM training_log line, 23.04 (and v2.6) through core_v0.19.0, and its "
                "argument dump; Megatron-DeepSpeed's line alike (tested on recorded and rebuilt "
                "lines)",
    "torchtitan": "torchtitan MetricsProcessor.log step line and the 'Trainer is initialized' "
                  "line, v0.1.0 through v0.2.2 and main (b5bcd76c), 0.3.0 alike; v0.2.2 run "
                  "live in CI",
}


def _number(m: re.Match) -> float:
    """The first group that matched (the whole match without groups) as a number."""
    text = next((g for g in m.groups() if g is not None), m.group(0))
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def read_log(lines: Iterable[str], patterns: Mapping[str, str]) -> tuple[list[dict], list[dict]]:
    """``(steps, facts)`` of ``lines``: one dict of the quantities found per logged step line,
    and every match of a :data:`FACTS` expression on any line (``{"name", "value", "line"}``)."""
    unknown = sorted(set(patterns) - set(QUANTITIES) - {"line"})
    if unknown:
        raise ValueError(f"log parser: unknown quantity {unknown[0]!r}; allowed: line, "
                         f"{', '.join(QUANTITIES)}")
    rx = {k: re.compile(v) for k, v in patterns.items()}
    line_rx = rx.pop("line", None)
    fact_rx = {k: rx.pop(k) for k in FACTS if k in rx}
    timing = [k for k in TIMING if k in rx]
    out, facts = [], []
    for raw in lines:
        line = ANSI.sub("", raw)
        for key, r in fact_rx.items():
            m = r.search(line)
            if m is not None:
                facts.append({"name": key, "value": _number(m), "line": raw.rstrip("\n")[:300]})
        if line_rx is not None:
            if not line_rx.search(line):
                continue
        elif not any(rx[k].search(line) for k in timing):
            continue
        found: dict = {}
        for key, r in rx.items():
            m = r.search(line)
            if m is not None:
                found[key] = _number(m)
        found["_line"] = raw.rstrip("\n")[:300]
        out.append(found)
    return out, facts


def read_lines(lines: Iterable[str], patterns: Mapping[str, str]) -> list[dict]:
    """The logged steps of ``lines`` (:func:`read_log` without the facts)."""
    return read_log(lines, patterns)[0]


def _the(name: str) -> str:
    """'the torchtitan log', 'the log' (the study's own expressions)."""
    return "the log" if name == "log" else f"the {name} log"


#: What each fact is called in a reason, and the placeholder that passes the point's value.
_FACT_WORDS = {"global_batch": ("global batch", "sequences", "{global_batch}"),
               "seq_len": ("sequence length", "tokens", "{seq_len}"),
               "total_steps": ("step count", "steps", "{steps}")}


def check_facts(facts: list[dict], *, global_batch: int, seq_len: int, steps: int,
                name: str = "log") -> str | None:
    """The first fact of :func:`read_log` that is not the point's (its global batch in
    sequences, its sequence length in tokens, its optimizer steps), as the reason; None when
    every printed fact agrees (or none is printed)."""
    want = {"global_batch": global_batch, "seq_len": seq_len, "total_steps": steps}
    for f in facts:
        if f["value"] == want[f["name"]]:
            continue
        what, unit, placeholder = _FACT_WORDS[f["name"]]
        return (f"{_the(name)} says {what} {plain(f['value'])} ({f['line'][:120]!r}), the "
                f"point's is {want[f['name']]} {unit}: the command does not run the point "
                f"(pass {placeholder})")
    return None


def _measured(gib: float) -> bool:
    """A logged memory that is a measurement: finite and not negative (``-0.00`` is negative:
    torchtitan's -1 byte, rounded)."""
    return math.isfinite(gib) and math.copysign(1.0, gib) > 0


def unmeasured(found: list[dict]) -> str | None:
    """Why the logged peak memory is left empty (:data:`UNMEASURED_MEMORY`), or None."""
    bad = [f["peak_memory_gib"] for f in found
           if "peak_memory_gib" in f and not _measured(f["peak_memory_gib"])]
    return UNMEASURED_MEMORY.format(value=bad[0]) if bad else None


def to_steps(found: list[dict], *, n: int, seq_len: int, tokens_per_step: float,
             warmup_steps: int, steps: int, name: str = "log") -> tuple[list[dict], str | None]:
    """``steps.jsonl`` records (``scalestudy.record.steps``) from :func:`read_lines`' output,
    and the first problem (None when the metrics are complete): no logged step, a step without
    a time, a time that is not a positive number, tokens per step other than the point's, a
    last logged step other than the point's ``steps``, no step after the warm-up. A negative
    (unmeasured) peak memory is left out (:func:`unmeasured` says why)."""
    if not found:
        return [], f"no line of stdout.log matches the {name} metrics line"
    by_step: dict[int, dict] = {}
    for i, f in enumerate(found, 1):
        step = int(f["step"]) if "step" in f and math.isfinite(f["step"]) else i
        if "tokens" in f:
            tokens = f["tokens"]
        elif "samples" in f:
            tokens = f["samples"] * seq_len
        else:
            tokens = tokens_per_step
        if not (math.isfinite(tokens) and tokens > 0):
            return [], f"step {step}: tokens per step {tokens!r} ({f['_line']!r})"
        if abs(tokens - tokens_per_step) > 1e-9 * tokens_per_step:
            what = (f"{plain(f['samples'])} sequences ({plain(tokens)} tokens)" if "samples" in f
                    and "tokens" not in f else f"{plain(tokens)} tokens")
            return [], (f"the {name} log says {what} per step at step {step}, the point trains "
                        f"{plain(tokens_per_step)} tokens per step: the command does not train "
                        "the point's batch (pass {global_batch}/{micro_batch}/{seq_len})")
        if "step_time_s" in f:
            t = f["step_time_s"]
        elif "step_time_ms" in f:
            t = f["step_time_ms"] / 1e3
        elif "tokens_per_s" in f:
            t = tokens / f["tokens_per_s"] if f["tokens_per_s"] else math.inf
        elif "tokens_per_s_per_device" in f:
            rate = f["tokens_per_s_per_device"]
            t = tokens / (rate * n) if rate else math.inf
        else:
            return [], f"step {step}: no step time or throughput in the line ({f['_line']!r})"
        if not (math.isfinite(t) and t > 0):
            return [], f"step {step}: step time {t!r} s is not a positive number ({f['_line']!r})"
        loss = f.get("loss")
        peak = f.get("peak_memory_gib")
        rec = {"step": step, "t": t, "loss": loss, "tokens": tokens,
               "peak": None if peak is None or not _measured(peak) else int(peak * 2**30)}
        if step not in by_step or t > by_step[step]["t"]:  # several ranks: the slowest
            by_step[step] = rec
    records, prev = [], 0
    for step in sorted(by_step):
        r = by_step[step]
        interval = max(1, step - prev)
        first = step - interval + 1
        rec = step_record(step, r["t"], r["loss"], r["tokens"], warmup=first <= warmup_steps,
                          peak_memory_bytes=r["peak"])
        if interval > 1:
            rec["interval"] = interval
        records.append(rec)
        prev = step
    last = records[-1]["step"]
    if last != steps:
        return records, (f"{_the(name)}'s last step is {last}, the point trains {steps} "
                         "steps: the command stopped early or ran another step count (pass "
                         "{steps}; log every step, or an interval that divides it)")
    if all(r["warmup"] for r in records):
        return records, (f"no steady-state step in the {name} log: {len(records)} logged "
                         f"step(s), the last one ({records[-1]['step']}) within the "
                         f"{warmup_steps} warm-up steps")
    return records, None


def parse_log(lines: Iterable[str], patterns: Mapping[str, str], *, n: int, seq_len: int,
          tokens_per_step: float, warmup_steps: int, steps: int, name: str = "log"
          ) -> tuple[list[dict], str | None]:
    """:func:`read_log`, :func:`check_facts` (the global batch is ``tokens_per_step /
    seq_len``) then :func:`to_steps`: the records and the first problem."""
    found, facts = read_log(lines, patterns)
    problem = check_facts(facts, global_batch=round(tokens_per_step / seq_len),
                          seq_len=seq_len, steps=steps, name=name)
    if problem:
        return [], problem
    return to_steps(found, n=n, seq_len=seq_len, tokens_per_step=tokens_per_step,
                    warmup_steps=warmup_steps, steps=steps, name=name)
