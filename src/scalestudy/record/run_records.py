"""The one reader of each run record: ``steps.jsonl``, ``status.json``, ``summary.json``,
``point.json``, ``env.json``, ``plan.tsv``, ``calibration.json`` and ``study.json``.

Every reader checks types and physical ranges and returns either a sound record or the reason
it is not one (one line naming the file and the field); aggregate, status, compare, plot and
the runner all read through here, so a damaged record becomes an ``invalid`` run with that
reason, never a traceback and never a number in a table. Reads are bounded
(``scalestudy.record.bounded_read``: regular files only, capped, UTF-8).

Ranges (units as in the records): step times, tokens, FLOPs, peaks and rates finite and > 0;
counts integers (``bool`` is not a number); wall times and memory finite and >= 0; step
numbers integers, consecutive and unique; the number of steps equal to the point's
``train.steps``; a run folder's ``point.json`` must be the folder's point (its ``point_id``
the folder's name, its ``config_hash`` the plan's).

Against the point (``point.json``; the pure checks of ``scalestudy.record.against_point``):
every step trained the
point's tokens (global batch x sequence length; a line's optional ``global_batch``,
``seq_len`` and its per-rank ``rank_energy_j`` list, one entry per rank, agree); the summary's
``tokens_per_step`` and ``steps``; the world size (``env.json``'s ``world_size`` and its list
of ``ranks``) is the point's ``n``; a layout a record states (``layout``: dp, tp, pp, cp) is
the point's. A loss that was not finite (the ``loss_nonfinite`` marker of
``scalestudy.record.loss``, or a NaN/Infinity literal) makes the run invalid: ``loss
diverged: non-finite loss (nan) at step K``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from scalestudy.config import settings
from scalestudy.config.parts import Parallel
from scalestudy.record import profile_record, stragglers
from scalestudy.record.against_point import (PointFacts, env_vs_point, point_facts,
                                             step_vs_point, summary_vs_point)
from scalestudy.record.loss import NONFINITE_KEY, diverged, nonfinite_loss
from scalestudy.record.bounded_read import (RecordError, check_field, is_int, is_text,
                                       nonneg, positive, read_object, read_text, show)
from scalestudy.record.states import RunState


# --- steps.jsonl -----------------------------------------------------------------------------

#: Keys every line must have.
REQUIRED = ("step", "step_time_s", "loss", "tokens")
#: The physical range of one optimizer step's wall time (s): above a nanosecond (no step of
#: any model is faster; 1e-300 would give an efficiency of 1e297) and below 10^7 s (115 days).
STEP_TIME_RANGE_S = (1e-9, 1e7)


#: The values of a line's ``loss_nonfinite`` (None: absent).
_NONFINITE = (None, "nan", "inf", "-inf")


def parse_steps(text: str, source: str = "steps.jsonl", point: dict | None = None
                ) -> tuple[list[dict], str | None]:
    """The records of a ``steps.jsonl`` text and the first problem (None: it meets the
    contract of ``scalestudy.record.steps``): a line that is not a JSON object, a missing
    key, a step time or token count that is not a finite positive number, a loss that is not
    a number or null, a loss that was not finite (the run diverged), a ``warmup`` that is not
    a bool, step numbers not consecutive (each the previous one + 1: no gap, no repeat);
    with ``point`` (a ``point.json`` object) a line that is not the point's
    (:func:`step_vs_point`)."""
    records: list[dict] = []
    return records, _check_lines(text, source, records.append, point_facts(point))


def _check_lines(text: str, source: str, keep, facts: "PointFacts | None" = None
                 ) -> str | None:
    """Check every line of a ``steps.jsonl`` text (against ``facts`` when given), handing
    each sound record to ``keep``; the first problem, or None."""
    last = None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return f"{source} line {i}: not JSON ({line[:60]!r})"
        if not isinstance(rec, dict):
            return f"{source} line {i}: not a JSON object"
        missing = [k for k in REQUIRED if k not in rec]
        if missing:
            return f"{source} line {i}: no {', '.join(missing)}"
        if not is_int(rec["step"]) or rec["step"] < 0:
            return f"{source} line {i}: step {show(rec['step'])} is not an integer >= 0"
        if not positive(rec["step_time_s"]):
            return (f"{source} line {i}: step_time_s {show(rec['step_time_s'])} is "
                             "not a positive number")
        lo, hi = STEP_TIME_RANGE_S
        if not lo < rec["step_time_s"] < hi:
            return (f"{source} line {i}: step_time_s {show(rec['step_time_s'])} is "
                             f"outside the physical range ({lo:g} s, {hi:g} s)")
        if not positive(rec["tokens"]):
            return f"{source} line {i}: tokens {show(rec['tokens'])} is not a positive number"
        loss = rec["loss"]
        if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool)):
            return f"{source} line {i}: loss {show(loss)} is not a number or null"
        if rec.get(NONFINITE_KEY) not in _NONFINITE:
            return (f"{source} line {i}: {NONFINITE_KEY} {show(rec[NONFINITE_KEY])} is not "
                    "nan, inf or -inf")
        mark = nonfinite_loss(rec)
        if mark is not None:
            return diverged(rec["step"], mark)
        if "warmup" in rec and not isinstance(rec["warmup"], bool):
            return f"{source} line {i}: warmup {show(rec['warmup'])} is not true/false"
        peak = rec.get("peak_memory_bytes")
        if peak is not None and not nonneg(peak):
            return (f"{source} line {i}: peak_memory_bytes {show(peak)} is not a "
                             "number >= 0")
        if last is not None and rec["step"] != last + 1:
            what = "repeats" if rec["step"] <= last else "skips after"
            return (f"{source} line {i}: step {rec['step']} {what} step {last} (one line "
                    "per step, in order)")
        if facts is not None:
            problem = step_vs_point(rec, facts, source)
            if problem:
                return problem
        last = rec["step"]
        keep(rec)
    return None


@dataclass
class Steps:
    """A sound ``steps.jsonl``: per step its time (s) and whether it is warm-up."""

    times: list[float]
    warmup: list[bool]

    def steady(self) -> list[float]:
        """Step times (s) of the steps not flagged warm-up."""
        return [t for t, w in zip(self.times, self.warmup) if not w]


def read_steps(path: str | os.PathLike, expect_steps: int | None = None,
               point: dict | None = None) -> tuple[Steps | None, str | None]:
    """``(steps, None)`` or ``(None, reason)``; ``expect_steps``: the point's ``train.steps``
    (the file must hold exactly that many lines; taken from ``point`` when not given);
    ``point``: the run's ``point.json`` object, every line checked against it
    (:func:`step_vs_point`)."""
    facts = point_facts(point)
    if expect_steps is None and facts is not None:
        expect_steps = facts.steps
    name = os.path.basename(os.fspath(path))
    try:
        text = read_text(path)
    except RecordError as e:
        return None, str(e)
    if text is None:
        return None, f"no {name}"
    times: list[float] = []
    warmup: list[bool] = []

    def keep(r: dict) -> None:  # only what the tables need: 1M steps stay small
        times.append(float(r["step_time_s"]))
        warmup.append(bool(r.get("warmup", False)))
    problem = _check_lines(text, name, keep, facts)
    del text
    if problem:
        return None, problem
    if not times:
        return None, f"{name}: no steps"
    if expect_steps is not None and len(times) != expect_steps:
        return None, (f"{name}: {len(times)} steps, the point trains {expect_steps} "
                      "(cut short or padded)")
    return Steps(times, warmup), None


# --- status.json -----------------------------------------------------------------------------


def check_status(status: dict, name: str = "status.json") -> dict:
    """``status`` when sound (a known state, types of the runner's keys); else RecordError."""
    if "state" not in status:
        raise RecordError(f"{name}: no state")
    try:
        RunState(status["state"])
    except (ValueError, TypeError):
        raise RecordError(f"{name}: unknown state {show(status['state'])}") from None
    check_field(status, name, "reason", is_text, "text")
    check_field(status, name, "exit_code", is_int, "an integer")
    check_field(status, name, "wall_s", nonneg, "a number of seconds >= 0")
    check_field(status, name, "log_cut_bytes", lambda v: is_int(v) and v >= 0,
           "a count of bytes >= 0")
    for k in ("started", "finished"):
        check_field(status, name, k, is_text, "a time stamp")
    check_field(status, name, "evidence", lambda v: isinstance(v, list)
           and all(isinstance(x, str) for x in v), "a list of lines")
    return status


def read_status(run_dir: str | os.PathLike) -> tuple[dict | None, str | None]:
    """``(status, None)``; ``(None, None)`` when there is no ``status.json`` (not run);
    ``(None, reason)`` when it is damaged (the run is ``invalid``, and ``scalestudy run``
    reruns it: :func:`damaged_status`)."""
    return _read_checked(run_dir, "status.json", check_status)


def damaged_status(run_dir: str | os.PathLike) -> str | None:
    """Why the run folder's ``status.json`` is damaged (None: absent or sound)."""
    return read_status(run_dir)[1]


# --- summary.json ----------------------------------------------------------------------------

_SUMMARY_POSITIVE = ("step_time_median_s", "tokens_per_s", "tokens_per_step", "n_params",
                     "peak_flops_per_device")
_SUMMARY_NONNEG = ("peak_memory_bytes", "peak_memory_reserved_bytes", "train_wall_s")
_SUMMARY_TEXT = ("point_id", "config_hash", "device_type", "device_name", "hardware", "dtype",
                 "peak_source", "memory_kind", "workload")


def check_summary(s: dict, name: str = "summary.json") -> dict:
    for k in _SUMMARY_POSITIVE:
        check_field(s, name, k, positive, "a positive number")
    for k in _SUMMARY_NONNEG:
        check_field(s, name, k, nonneg, "a number >= 0")
    for k in _SUMMARY_TEXT:
        check_field(s, name, k, is_text, "text")
    for k in ("steps", "warmup_steps", "repeat"):
        check_field(s, name, k, lambda v: is_int(v) and v >= 0, "an integer >= 0")
    for k in ("loss_first", "loss_last", "loss_noise_floor"):
        check_field(s, name, k, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "a number")
    for k in ("model_flops_per_step", "hardware_flops_per_step"):
        table = s.get(k)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise RecordError(f"{name}: {k} {show(table)} is not a table of FLOPs per convention")
        for conv, v in table.items():
            if v is not None and not positive(v):
                raise RecordError(f"{name}: {k}.{conv} {show(v)} is not a positive number of FLOPs")
    check_field(s, name, NONFINITE_KEY, lambda v: v in _NONFINITE, "nan, inf or -inf")
    check_field(s, name, f"{NONFINITE_KEY}_step", lambda v: is_int(v) and v >= 0, "an integer >= 0")
    check_field(s, name, "world_size", lambda v: is_int(v) and v > 0, "an integer > 0")
    check_field(s, name, "layout", _layout, "a table of whole numbers (dp, tp, pp, cp)")
    check_field(s, name, "energy", lambda v: isinstance(v, dict), "an object")
    e = s.get("energy") or {}
    for k in ("joules_per_token", "avg_power_w"):
        if e.get(k) is not None and not positive(e[k]):
            raise RecordError(f"{name}: energy.{k} {show(e[k])} is not a positive number")
    why = stragglers.record_problem(s.get(stragglers.SUMMARY_KEY))
    if why:
        raise RecordError(f"{name}: {stragglers.SUMMARY_KEY}.{why}")
    why = profile_record.profile_problem(s.get(profile_record.PROFILE_KEY))
    if why:
        raise RecordError(f"{name}: {profile_record.PROFILE_KEY} {why}")
    return s


def read_summary(run_dir: str | os.PathLike, point_id: str | None = None,
                 config_hash: str | None = None, point: dict | None = None
                 ) -> tuple[dict | None, str | None]:
    """``(summary, None)``, ``(None, None)`` when absent, ``(None, reason)`` when damaged,
    another point's (``point_id`` / ``config_hash`` given and different), not the point's
    run (``point``: its ``point.json`` object; :func:`summary_vs_point`) or a diverged
    run's."""
    facts = point_facts(point) or PointFacts()
    return _read_checked(run_dir, "summary.json", check_summary, point_id, config_hash,
                         lambda s: summary_vs_point(s, facts))


def _read_checked(folder, name: str, check, point_id: str | None = None,
                  config_hash: str | None = None, versus=None) -> tuple[dict | None, str | None]:
    """``(record, None)``, ``(None, None)`` when absent, ``(None, reason)`` when ``check``
    (or, with ``point_id`` / ``config_hash``, the point's identity; then ``versus(record)``,
    the problem against the point or None) refuses it."""
    try:
        rec = read_object(os.path.join(os.fspath(folder), name))
        if rec is None:
            return None, None
        check(rec)
        _same_point(rec, name, point_id, config_hash)
    except RecordError as e:
        return None, str(e)
    problem = versus(rec) if versus is not None else None
    return (None, problem) if problem else (rec, None)


def _same_point(rec: dict, name: str, point_id: str | None, config_hash: str | None) -> None:
    if point_id and rec.get("point_id") not in (None, point_id):
        raise RecordError(f"{name}: point_id {show(rec.get('point_id'))} is not this run "
                          f"folder's point ({point_id}): a foreign record")
    if config_hash and rec.get("config_hash") not in (None, config_hash):
        raise RecordError(f"{name}: config_hash {str(rec.get('config_hash'))[:12]!r} is not "
                          f"the plan's ({str(config_hash)[:12]}): a foreign record")


# --- point.json ------------------------------------------------------------------------------


def check_point(p: dict, name: str = "point.json") -> dict:
    """The fields aggregate and compare read, typed (the whole point is checked by
    ``scalestudy.config.point.Point.from_json`` where it is rebuilt)."""
    for k, kind in (("model", dict), ("train", dict), ("platform", dict), ("parallel", dict)):
        if k in p and not isinstance(p[k], kind):
            raise RecordError(f"{name}: {k} {show(p[k])} is not an object")
    for k in ("n", "tp", "pp", "cp"):
        check_field(p, name, k, lambda v: is_int(v) and v > 0, "an integer > 0")
    for k in ("dp", "global_batch"):  # (fractions in an infeasible point)
        check_field(p, name, k, positive, "a positive number")
    train = p.get("train") or {}
    check_field(train, name, "steps", lambda v: is_int(v) and v > 0, "an integer > 0")
    check_field(train, name, "warmup_steps", lambda v: is_int(v) and v >= 0, "an integer >= 0")
    plat = p.get("platform") or {}
    for k in ("hardware", "device"):
        check_field(plat, name, k, is_text, "text")
    check_field(p, name, "flops_convention", is_text, "text")
    for k in ("point_id", "config_hash", "study", "series"):
        check_field(p, name, k, is_text, "text")
    model = p.get("model") or {}
    for k, v in model.items():
        if isinstance(v, (dict, list)):
            raise RecordError(f"{name}: model.{k} {show(v)} is not a value")
    check_field(model, name, "seq_len", lambda v: is_int(v) and v > 0, "an integer > 0")
    return p


def read_point(run_dir: str | os.PathLike, point_id: str | None = None,
               config_hash: str | None = None) -> tuple[dict | None, str | None]:
    """``(point.json object, None)``, ``(None, None)`` when absent, ``(None, reason)`` when
    damaged or foreign (another point id or config hash than the plan's)."""
    return _read_checked(run_dir, "point.json", check_point, point_id, config_hash)


def run_problem(run_dir: str | os.PathLike, point: dict) -> str | None:
    """Why a finished run's records are not a sound run of ``point`` (its ``point.json``
    object): the first reason of its summary, steps and env read against it (a diverged loss
    included), or None. The runner's verdict on an attempt that ended well."""
    pid, chash = point.get("point_id"), point.get("config_hash")
    for why in (read_summary(run_dir, pid, chash, point)[1],
                read_steps(os.path.join(run_dir, "steps.jsonl"), point=point)[1],
                read_env(run_dir, point)[1]):
        if why:
            return why
    return None


# --- env.json --------------------------------------------------------------------------------


def check_env(e: dict, name: str = "env.json") -> dict:
    check_field(e, name, "hosts", lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
           "a list of host names")
    for k in ("device_name", "torch", "cuda", "rocm", "nccl", "git_commit", "python",
              "platform", "config_hash", "device_type", "backend"):
        check_field(e, name, k, is_text, "text")
    check_field(e, name, "slurm", lambda v: isinstance(v, dict) and all(isinstance(x, str)
                                                                     for x in v.values()),
           "a table of text")
    check_field(e, name, "world_size", lambda v: is_int(v) and v > 0, "an integer > 0")
    check_field(e, name, "ranks", lambda v: isinstance(v, list), "a list of ranks")
    check_field(e, name, "layout", _layout, "a table of whole numbers (dp, tp, pp, cp)")
    return e


def _layout(v) -> bool:
    return isinstance(v, dict) and all(is_int(x) and x > 0 for x in v.values())


def read_env(run_dir: str | os.PathLike, point: dict | None = None
             ) -> tuple[dict | None, str | None]:
    """``(env.json object, None)``, ``(None, None)`` when absent, ``(None, reason)`` when
    damaged or, with ``point`` (its ``point.json`` object), not the point's world size or
    layout (:func:`env_vs_point`)."""
    facts = point_facts(point) or PointFacts()
    return _read_checked(run_dir, "env.json", check_env,
                         versus=lambda e: env_vs_point(e, facts))


# --- calibration.json, study.json ------------------------------------------------------------


def read_calibration(study_dir: str | os.PathLike) -> tuple[dict | None, str | None]:
    """The measured matmul ceiling record: ``flops_per_s`` finite and > 0, ``dtype`` and
    ``device_type`` text. ``(None, reason)`` when damaged (no ceiling is used)."""
    try:
        c = read_object(os.path.join(os.fspath(study_dir), "calibration.json"))
        if c is None:
            return None, None
        name = "calibration.json"
        check_field(c, name, "flops_per_s", positive, "a positive number of FLOP/s", optional=False)
        for k in ("dtype", "device_type", "device_name"):
            check_field(c, name, k, is_text, "text")
        return c, None
    except RecordError as e:
        return None, str(e)


def read_study(study_dir: str | os.PathLike) -> dict | None:
    """The resolved ``study.json`` (None when absent); RecordError when it is damaged or of
    wrong types in the fields the tables read."""
    s = read_object(os.path.join(os.fspath(study_dir), "study.json"))
    if s is None:
        return None
    name = "study.json"
    for k in ("name", "flops_convention", "description"):
        check_field(s, name, k, is_text, "text")
    for k, kind, what in (("series", list, "a list"), ("train", dict, "an object"),
                          ("platform", dict, "an object"), ("report", dict, "an object"),
                          ("references", list, "a list")):
        check_field(s, name, k, lambda v, kind=kind: isinstance(v, kind), what)
    for i, ser in enumerate(s.get("series") or []):
        if not isinstance(ser, dict) or not isinstance(ser.get("name"), str):
            raise RecordError(f"{name}: series[{i}] is not a series with a name")
        check_field(ser, name, "baseline", lambda v: is_int(v) and v > 0, "an integer > 0")
    if not all(isinstance(r, str) for r in s.get("references") or []):
        raise RecordError(f"{name}: references must be names")
    train = s.get("train") or {}
    check_field(train, name, "steps", lambda v: is_int(v) and v > 0, "an integer > 0")
    plat = s.get("platform") or {}
    check_field(plat, name, "timeout_s", positive, "a positive number of seconds")
    check_field(plat, name, "device", is_text, "text")
    return s


# --- plan.tsv --------------------------------------------------------------------------------

#: Columns a plan must have, and the integer ones among them.
PLAN_REQUIRED = ("point_id", "series", "mode", "n", "feasible")
PLAN_INTS = ("n", "dp", "tp", "pp", "nodes", "procs_per_node", "micro_batch", "grad_accum",
             "global_batch", "seq_len", "repeat", "baseline_n",
             *(k for k in settings.names(Parallel, column=True)
               if settings.value_type(Parallel, k) is int))
PLAN_POSITIVE = ("tokens_per_step", "tokens_per_device_step")


def read_plan(study_dir: str | os.PathLike) -> list[dict] | None:
    """Rows of ``plan.tsv`` as text fields (None: no plan); RecordError (one line) for a file
    that is empty, not UTF-8, cut (a row with another number of fields than the header),
    holds a point twice or a count that is not a whole number."""
    path = os.path.join(os.fspath(study_dir), "plan.tsv")
    text = read_text(path)
    if text is None:
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].strip():
        raise RecordError("plan.tsv: empty; rerun `scalestudy run STUDY.yaml` (or "
                          "`scalestudy plan STUDY.yaml --write`)")
    head = lines[0].split("\t")
    missing = [c for c in PLAN_REQUIRED if c not in head]
    if missing or len(set(head)) != len(head):
        raise RecordError(f"plan.tsv: header lacks {', '.join(missing) or 'unique names'}; "
                          "rewrite it with `scalestudy plan STUDY.yaml --write`")
    rows, seen = [], set()
    fix = "rewrite it with `scalestudy plan STUDY.yaml --write`"
    for i, ln in enumerate(lines[1:], 2):
        if not ln.strip():
            continue
        cells = ln.split("\t")
        if len(cells) != len(head):
            raise RecordError(f"plan.tsv line {i}: {len(cells)} fields, the header has "
                              f"{len(head)} (a cut or damaged file); {fix}")
        row = dict(zip(head, cells))
        pid = row["point_id"]
        if not pid or "/" in pid or pid in (".", ".."):
            raise RecordError(f"plan.tsv line {i}: point_id {pid!r} is not a run folder name; {fix}")
        if pid in seen:
            raise RecordError(f"plan.tsv line {i}: point {pid} is listed twice; {fix}")
        seen.add(pid)
        if row["feasible"] not in ("True", "False", "true", "false", "1", "0"):
            raise RecordError(f"plan.tsv line {i}: feasible {row['feasible']!r} is not True/False; {fix}")
        for c in PLAN_INTS if feasible(row) else ():  # (a skipped point keeps its fractions)
            v = row.get(c, "")
            if v != "" and not _whole_count_text(v):
                raise RecordError(f"plan.tsv line {i}: {c} {v!r} is not a whole number; {fix}")
        if not _whole_count_text(row["n"]) or float(row["n"]) < 1:
            raise RecordError(f"plan.tsv line {i}: n {row['n']!r} is not a count >= 1; {fix}")
        for c in PLAN_POSITIVE:
            v = row.get(c, "")
            if v != "" and not _positive_text(v):
                raise RecordError(f"plan.tsv line {i}: {c} {v!r} is not a positive number; {fix}")
        rows.append(row)
    return rows


def _whole_count_text(v: str) -> bool:
    try:
        x = float(v)
    except ValueError:
        return False
    return math.isfinite(x) and x.is_integer() and x >= 0


def _positive_text(v: str) -> bool:
    try:
        x = float(v)
    except ValueError:
        return False
    return math.isfinite(x) and x > 0


def feasible(row: dict) -> bool:
    """A plan row's ``feasible`` field as a bool."""
    return str(row.get("feasible", "True")).lower() in ("true", "1", "yes")
