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
- ``peak_memory_gib``.

A logged line may stand for several steps (a log interval: Megatron's ``--log-interval``,
torchtitan's ``metrics.log_freq``): its step time is the trainer's average over the interval,
and it is one sample of the steady state. A line whose interval holds a warm-up step (the
point's ``train.warmup_steps``) is warm-up. Several ranks logging the same step: the slowest
rank's line is kept. Log every step (interval 1) for per-step samples.

Shipped presets (``metrics: megatron`` / ``metrics: torchtitan``), each tested on real log
lines (``tests/test_logparse.py`` names the sources):

- :data:`MEGATRON` reads Megatron-LM's ``training_log`` line (``megatron/training.py``,
  ``megatron/training/training.py`` from core_v0.6.0), every version from 23.04 (and v2.6)
  through core_v0.19.0: the optional ``[timestamp]`` prefix (core_v0.6+, with microseconds
  from core_v0.16), ``throughput per GPU``, ``energy``/``power``, ``skipped samples`` and
  ``num zeros`` fields. Step time is ``elapsed time per iteration (ms)``; the loss is ``lm
  loss`` (GPT pretraining); tokens are ``global batch size`` × seq_len, checked against the
  point. Megatron-DeepSpeed's line has the same fields and reads alike.
- :data:`TORCHTITAN` reads torchtitan's ``MetricsProcessor.log`` step line, v0.1.0 through
  v0.2.2 and main (``grad_norm`` from v0.2.0, ``loss`` with 5 decimals from v0.2.2, ``mfu:
  N/A`` on main, colours or not, ``[rank0]:`` prefixes); validation lines are skipped.
  ``tps`` is tokens per second per device (torchtitan divides by tp·pp·cp), so the step time
  is tokens per step / (tps × N); memory is ``max_reserved`` GiB.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Mapping

ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The quantities a parser may name, besides ``line``.
QUANTITIES = ("step", "step_time_s", "step_time_ms", "tokens_per_s", "tokens_per_s_per_device",
              "loss", "tokens", "samples", "peak_memory_gib")
#: Expressions that make a line a logged step when there is no ``line`` expression.
TIMING = ("step_time_s", "step_time_ms", "tokens_per_s", "tokens_per_s_per_device")
_NUM = r"([-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)"

MEGATRON: dict[str, str] = {
    "line": r"\biteration\s+\d+\s*/\s*\d+\s*\|",
    "step": r"\biteration\s+(\d+)\s*/",
    "step_time_ms": r"\belapsed time per iteration \(ms\):\s*" + _NUM,
    "loss": r"\|\s*lm loss:\s*" + _NUM,
    "samples": r"\bglobal batch size:\s*(\d+)",
}

TORCHTITAN: dict[str, str] = {
    "line": r"^(?!.*\bvalidate step:).*\bstep:\s*\d+\s+loss:.*\btps:",
    "step": r"\bstep:\s*(\d+)",
    "loss": r"\bloss:\s*" + _NUM,
    "tokens_per_s_per_device": r"\btps:\s*([\d,]+)",
    "peak_memory_gib": r"\bmemory:\s*" + _NUM + r"\s*GiB",
}

PRESETS: dict[str, dict[str, str]] = {"megatron": MEGATRON, "torchtitan": TORCHTITAN}
#: What each preset reads, by version (recorded in summary.json as ``metrics_reads``).
READS: dict[str, str] = {
    "megatron": "Megatron-LM training_log line, 23.04 (and v2.6) through core_v0.19.0; "
                "Megatron-DeepSpeed's line alike",
    "torchtitan": "torchtitan MetricsProcessor.log step line, v0.1.0 through v0.2.2 and main "
                  "(b5bcd76c)",
}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def read_lines(lines: Iterable[str], patterns: Mapping[str, str]) -> list[dict]:
    """The logged steps of ``lines``: one dict of the quantities found per read line."""
    unknown = sorted(set(patterns) - set(QUANTITIES) - {"line"})
    if unknown:
        raise ValueError(f"log parser: unknown quantity {unknown[0]!r}; allowed: line, "
                         f"{', '.join(QUANTITIES)}")
    rx = {k: re.compile(v) for k, v in patterns.items()}
    line_rx = rx.pop("line", None)
    timing = [k for k in TIMING if k in rx]
    out = []
    for raw in lines:
        line = ANSI.sub("", raw)
        if line_rx is not None:
            if not line_rx.search(line):
                continue
        elif not any(rx[k].search(line) for k in timing):
            continue
        found: dict = {}
        for key, r in rx.items():
            m = r.search(line)
            if m is None:
                continue
            try:
                found[key] = _number(m.group(1) if m.groups() else m.group(0))
            except ValueError:
                found[key] = math.nan
        found["_line"] = raw.rstrip("\n")[:300]
        out.append(found)
    return out


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def to_steps(found: list[dict], *, n: int, seq_len: int, tokens_per_step: float,
             warmup_steps: int, name: str = "log") -> tuple[list[dict], str | None]:
    """``steps.jsonl`` records (``scalestudy.train.metrics``) from :func:`read_lines`' output,
    and the first problem (None when the metrics are complete): no logged step, a step without
    a time, a time that is not a positive number, tokens per step other than the point's, no
    step after the warm-up."""
    from scalestudy.train.metrics import step_record

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
            what = (f"{_fmt(f['samples'])} sequences ({_fmt(tokens)} tokens)" if "samples" in f
                    and "tokens" not in f else f"{_fmt(tokens)} tokens")
            return [], (f"the {name} log says {what} per step at step {step}, the point trains "
                        f"{_fmt(tokens_per_step)} tokens per step: the command does not train "
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
               "peak": None if peak is None or not math.isfinite(peak) else int(peak * 2**30)}
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
    if all(r["warmup"] for r in records):
        return records, (f"no steady-state step in the {name} log: {len(records)} logged "
                         f"step(s), the last one ({records[-1]['step']}) within the "
                         f"{warmup_steps} warm-up steps")
    return records, None


def parse(lines: Iterable[str], patterns: Mapping[str, str], **point_facts
          ) -> tuple[list[dict], str | None]:
    """:func:`read_lines` then :func:`to_steps`."""
    return to_steps(read_lines(lines, patterns), **point_facts)
