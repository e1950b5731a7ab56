"""The one reader of each run record: ``steps.jsonl``, ``status.json``, ``summary.json``,
``point.json``, ``env.json``, ``plan.tsv``, ``calibration.json`` and ``study.json``.

Every reader checks types and physical ranges and returns either a sound record or the reason
it is not one (one line naming the file and the field); aggregate, status, compare, plot and
the runner all read through here, so a damaged record becomes an ``invalid`` run with that
reason, never a traceback and never a number in a table. Reads are bounded: regular files
only (a FIFO, a device or a folder is refused without being opened for reading: ``os.stat``
first, then ``O_NONBLOCK`` and ``fstat`` on the open descriptor), at most
:data:`MAX_BYTES` bytes, text must be UTF-8.

Ranges (units as in the records): step times, tokens, FLOPs, peaks and rates finite and > 0;
counts integers (``bool`` is not a number); wall times and memory finite and >= 0; step
numbers integers, consecutive and unique; the number of steps equal to the point's
``train.steps``; a run folder's ``point.json`` must be the folder's point (its ``point_id``
the folder's name, its ``config_hash`` the plan's).

Against the point (``point.json``; :func:`point_facts`, the pure checks
:func:`step_vs_point`, :func:`summary_vs_point`, :func:`env_vs_point`): every step trained the
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
import stat
from dataclasses import dataclass

from scalestudy.config.files import ReadProblem, read_capped
from scalestudy.record import stragglers
from scalestudy.record.states import RunState
from scalestudy.record.loss import NONFINITE_KEY, diverged, nonfinite_loss

#: Size caps (bytes) per record; a larger file is damaged, not read. steps.jsonl: about 256
#: bytes a line for the schema's 1,000,000 steps.
MAX_BYTES = {"steps.jsonl": 256 * 2**20, "plan.tsv": 64 * 2**20}
MAX_JSON_BYTES = 16 * 2**20  # status, summary, point, env, calibration, study


class RecordError(ValueError):
    """A record that cannot be used: one line, the file and what is wrong."""


def one_line(e: BaseException | str) -> str:
    """An error message on one line, without terminal control characters."""
    return printable(str(e)).replace("\n", " ")


_CONTROL = None


def printable(text: str) -> str:
    """``text`` with ANSI escape sequences and other control characters (tab and newline
    kept) removed: safe to print on a terminal."""
    global _CONTROL
    import re

    if _CONTROL is None:
        _CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)?|"
                              r"\x1b.?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
    return _CONTROL.sub("", text)


def read_bytes(path: str | os.PathLike, max_bytes: int | None = None) -> bytes | None:
    """The bytes of the regular file ``path``, None when it does not exist. Raises
    :class:`RecordError` for a FIFO, device, socket or folder (never opened for reading, so
    a FIFO cannot hang the reader), a file larger than ``max_bytes`` or an OS error."""
    path = os.fspath(path)  # (strings, not Path: this runs for every record of every run)
    name = os.path.basename(path)
    cap = max_bytes or MAX_BYTES.get(name, MAX_JSON_BYTES)
    try:
        return read_capped(path, cap)
    except ReadProblem as e:
        raise RecordError(f"{name}: " + {
            "os": f"cannot be read ({e.detail})",
            "folder": "not a regular file (a FIFO, device or folder): not read",
            "special": "not a regular file (a FIFO, device or folder): not read",
            "swapped": "not a regular file: not read",
            "size": f"{e.detail} bytes, more than the {cap} a sound record holds: not read",
            "grew": f"more than {cap} bytes: not read"}[e.kind]) from None


def read_text(path: str | os.PathLike, max_bytes: int | None = None) -> str | None:
    """:func:`read_bytes` decoded as UTF-8 (None: no file)."""
    data = read_bytes(path, max_bytes)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"{os.path.basename(os.fspath(path))}: not UTF-8 text (byte {e.start})") from None


def read_tail(path: str | os.PathLike, n_bytes: int = 1 << 20) -> str:
    """The last ``n_bytes`` of a log (regular files only; "" when missing or unreadable),
    undecodable bytes replaced."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return ""
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - n_bytes), os.SEEK_SET)
        return os.read(fd, n_bytes).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # (one, not one per record)


def read_object(path: str | os.PathLike) -> dict | None:
    """The JSON object in ``path`` (None: no file); :class:`RecordError` when it is not
    one (empty, cut, not UTF-8, NaN/Infinity literals, another JSON type)."""
    text = read_text(path)
    if text is None:
        return None
    name = os.path.basename(os.fspath(path))
    if not text.strip():
        raise RecordError(f"{name}: empty")
    try:
        data = _DECODER.decode(text)
    except (ValueError, RecursionError) as e:
        raise RecordError(f"{name}: not JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{name}: a JSON {type(data).__name__}, not an object")
    return data


# --- value checks ----------------------------------------------------------------------------


def is_number(x) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def positive(x) -> bool:
    """A finite number > 0."""
    return is_number(x) and x > 0


def _check(rec: dict, name: str, field: str, ok, what: str, optional: bool = True) -> None:
    if field not in rec or (optional and rec[field] is None):
        if not optional:
            raise RecordError(f"{name}: no {field}")
        return
    if not ok(rec[field]):
        raise RecordError(f"{name}: {field} {_show(rec[field])} is not {what}")


def _show(x) -> str:
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def _nonneg(x) -> bool:
    return is_number(x) and x >= 0


def _str(x) -> bool:
    return isinstance(x, str)


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
            return f"{source} line {i}: step {_show(rec['step'])} is not an integer >= 0"
        if not positive(rec["step_time_s"]):
            return (f"{source} line {i}: step_time_s {_show(rec['step_time_s'])} is "
                             "not a positive number")
        lo, hi = STEP_TIME_RANGE_S
        if not lo < rec["step_time_s"] < hi:
            return (f"{source} line {i}: step_time_s {_show(rec['step_time_s'])} is "
                             f"outside the physical range ({lo:g} s, {hi:g} s)")
        if not positive(rec["tokens"]):
            return f"{source} line {i}: tokens {_show(rec['tokens'])} is not a positive number"
        loss = rec["loss"]
        if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool)):
            return f"{source} line {i}: loss {_show(loss)} is not a number or null"
        if rec.get(NONFINITE_KEY) not in _NONFINITE:
            return (f"{source} line {i}: {NONFINITE_KEY} {_show(rec[NONFINITE_KEY])} is not "
                    "nan, inf or -inf")
        mark = nonfinite_loss(rec)
        if mark is not None:
            return diverged(rec["step"], mark)
        if "warmup" in rec and not isinstance(rec["warmup"], bool):
            return f"{source} line {i}: warmup {_show(rec['warmup'])} is not true/false"
        peak = rec.get("peak_memory_bytes")
        if peak is not None and not _nonneg(peak):
            return (f"{source} line {i}: peak_memory_bytes {_show(peak)} is not a "
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
        raise RecordError(f"{name}: unknown state {_show(status['state'])}") from None
    _check(status, name, "reason", _str, "text")
    _check(status, name, "exit_code", is_int, "an integer")
    _check(status, name, "wall_s", _nonneg, "a number of seconds >= 0")
    _check(status, name, "log_cut_bytes", lambda v: is_int(v) and v >= 0,
           "a count of bytes >= 0")
    for k in ("started", "finished"):
        _check(status, name, k, _str, "a time stamp")
    _check(status, name, "evidence", lambda v: isinstance(v, list)
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
_SUMMARY_NONNEG = ("peak_memory_bytes", "train_wall_s")
_SUMMARY_TEXT = ("point_id", "config_hash", "device_type", "device_name", "hardware", "dtype",
                 "peak_source", "memory_kind", "workload")


def check_summary(s: dict, name: str = "summary.json") -> dict:
    for k in _SUMMARY_POSITIVE:
        _check(s, name, k, positive, "a positive number")
    for k in _SUMMARY_NONNEG:
        _check(s, name, k, _nonneg, "a number >= 0")
    for k in _SUMMARY_TEXT:
        _check(s, name, k, _str, "text")
    for k in ("steps", "warmup_steps", "repeat"):
        _check(s, name, k, lambda v: is_int(v) and v >= 0, "an integer >= 0")
    for k in ("loss_first", "loss_last", "loss_noise_floor"):
        _check(s, name, k, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
               "a number")
    for k in ("model_flops_per_step", "hardware_flops_per_step"):
        table = s.get(k)
        if table is None:
            continue
        if not isinstance(table, dict):
            raise RecordError(f"{name}: {k} {_show(table)} is not a table of FLOPs per convention")
        for conv, v in table.items():
            if v is not None and not positive(v):
                raise RecordError(f"{name}: {k}.{conv} {_show(v)} is not a positive number of FLOPs")
    _check(s, name, NONFINITE_KEY, lambda v: v in _NONFINITE, "nan, inf or -inf")
    _check(s, name, f"{NONFINITE_KEY}_step", lambda v: is_int(v) and v >= 0, "an integer >= 0")
    _check(s, name, "world_size", lambda v: is_int(v) and v > 0, "an integer > 0")
    _check(s, name, "layout", _layout, "a table of whole numbers (dp, tp, pp, cp)")
    _check(s, name, "energy", lambda v: isinstance(v, dict), "an object")
    e = s.get("energy") or {}
    for k in ("joules_per_token", "avg_power_w"):
        if e.get(k) is not None and not positive(e[k]):
            raise RecordError(f"{name}: energy.{k} {_show(e[k])} is not a positive number")
    why = stragglers.record_problem(s.get(stragglers.SUMMARY_KEY))
    if why:
        raise RecordError(f"{name}: {stragglers.SUMMARY_KEY}.{why}")
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
        raise RecordError(f"{name}: point_id {_show(rec.get('point_id'))} is not this run "
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
            raise RecordError(f"{name}: {k} {_show(p[k])} is not an object")
    for k in ("n", "tp", "pp", "cp"):
        _check(p, name, k, lambda v: is_int(v) and v > 0, "an integer > 0")
    for k in ("dp", "global_batch"):  # (fractions in an infeasible point)
        _check(p, name, k, positive, "a positive number")
    train = p.get("train") or {}
    _check(train, name, "steps", lambda v: is_int(v) and v > 0, "an integer > 0")
    _check(train, name, "warmup_steps", lambda v: is_int(v) and v >= 0, "an integer >= 0")
    plat = p.get("platform") or {}
    for k in ("hardware", "device"):
        _check(plat, name, k, _str, "text")
    _check(p, name, "flops_convention", _str, "text")
    for k in ("point_id", "config_hash", "study", "series"):
        _check(p, name, k, _str, "text")
    model = p.get("model") or {}
    for k, v in model.items():
        if isinstance(v, (dict, list)):
            raise RecordError(f"{name}: model.{k} {_show(v)} is not a value")
    _check(model, name, "seq_len", lambda v: is_int(v) and v > 0, "an integer > 0")
    return p


def read_point(run_dir: str | os.PathLike, point_id: str | None = None,
               config_hash: str | None = None) -> tuple[dict | None, str | None]:
    """``(point.json object, None)``, ``(None, None)`` when absent, ``(None, reason)`` when
    damaged or foreign (another point id or config hash than the plan's)."""
    return _read_checked(run_dir, "point.json", check_point, point_id, config_hash)


# --- a run's records against its point -------------------------------------------------------

#: The layout sizes a record may state (``env.json``'s or ``summary.json``'s ``layout``).
LAYOUT_KEYS = ("dp", "tp", "pp", "cp")


@dataclass(frozen=True)
class PointFacts:
    """What a run's records must show, from its ``point.json`` (None: not known). Units:
    ``global_batch`` sequences, ``seq_len`` tokens, ``n`` ranks (the world size)."""

    steps: int | None = None
    global_batch: int | float | None = None
    seq_len: int | None = None
    n: int | None = None
    layout: tuple[tuple[str, int | float], ...] = ()

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens of one optimizer step, all ranks together: global batch x seq len."""
        if self.global_batch is None or self.seq_len is None:
            return None
        return self.global_batch * self.seq_len


def point_facts(point: dict | None) -> PointFacts | None:
    """The :class:`PointFacts` of a ``point.json`` object checked by :func:`check_point`
    (None: no point); a field of another type is left unknown."""
    if not point:
        return None
    model = point.get("model") if isinstance(point.get("model"), dict) else {}
    train = point.get("train") if isinstance(point.get("train"), dict) else {}

    def count(v):
        return v if positive(v) else None
    seq = model.get("seq_len", point.get("seq_len"))
    sizes = {k: point.get(k, 1 if k == "cp" else None) for k in LAYOUT_KEYS}  # (cp 1: absent)
    return PointFacts(
        steps=train.get("steps") if is_int(train.get("steps")) else None,
        global_batch=count(point.get("global_batch")),
        seq_len=seq if is_int(seq) and seq > 0 else None, n=count(point.get("n")),
        layout=tuple((k, v) for k, v in sizes.items() if positive(v)))


def _differs(have, want) -> bool:
    """A stated count that is not the point's (to a relative 1e-9: JSON floats)."""
    return not is_number(have) or abs(have - want) > 1e-9 * abs(want)


def _batch_words(facts: PointFacts) -> str:
    return f"global_batch {_fmt(facts.global_batch)} x seq_len {facts.seq_len}"


def _fmt(x) -> str:
    return str(int(x)) if is_number(x) and float(x).is_integer() else _show(x)


def step_vs_point(rec: dict, facts: PointFacts, source: str = "steps.jsonl") -> str | None:
    """Why one ``steps.jsonl`` line is not a step of the point (None: it is one): its
    ``tokens`` are not global batch x seq len; its optional ``global_batch`` / ``seq_len``
    are not the point's; its per-rank ``rank_energy_j`` lists another number of ranks than
    the point's ``n``."""
    step, want = rec.get("step"), facts.tokens_per_step
    if want is not None and _differs(rec.get("tokens"), want):
        return (f"{source}: step {step} trained {_fmt(rec.get('tokens'))} tokens, the point "
                f"trains {_fmt(want)} per step ({_batch_words(facts)})")
    for key in ("global_batch", "seq_len"):
        want = getattr(facts, key)
        if key in rec and want is not None and _differs(rec[key], want):
            return (f"{source}: step {step} states {key} {_show(rec[key])}, the point's is "
                    f"{_fmt(want)}")
    ranks = rec.get("rank_energy_j")
    if facts.n is not None and isinstance(ranks, list) and len(ranks) != facts.n:
        return (f"{source}: step {step} has rank_energy_j of {len(ranks)} rank(s), the point "
                f"runs on n={_fmt(facts.n)}")
    return None


def _layout_vs_point(rec: dict, facts: PointFacts, name: str) -> str | None:
    stated = rec.get("layout")
    if not isinstance(stated, dict):
        return None
    for key, want in facts.layout:
        if key in stated and _differs(stated[key], want):
            return (f"{name}: layout {key}={_show(stated[key])}, the point's is {key}="
                    f"{_fmt(want)} ({' '.join(f'{k}={_fmt(v)}' for k, v in facts.layout)})")
    return None


def summary_vs_point(s: dict, facts: PointFacts, name: str = "summary.json") -> str | None:
    """Why a sound ``summary.json`` is not a good run of the point (None: it is): a loss that
    was not finite (``loss_nonfinite``: the run diverged), ``tokens_per_step`` not global
    batch x seq len, ``steps`` not ``train.steps``, a stated world size (``world_size``) or
    ``layout`` not the point's."""
    if s.get(NONFINITE_KEY) is not None:
        return diverged(s.get(f"{NONFINITE_KEY}_step"), s[NONFINITE_KEY])
    want = facts.tokens_per_step
    if want is not None and "tokens_per_step" in s and _differs(s["tokens_per_step"], want):
        return (f"{name}: tokens_per_step {_fmt(s['tokens_per_step'])}, the point trains "
                f"{_fmt(want)} ({_batch_words(facts)})")
    if facts.steps is not None and s.get("steps") is not None and s["steps"] != facts.steps:
        return f"{name}: {s['steps']} steps, the point trains {facts.steps} (train.steps)"
    if facts.n is not None and s.get("world_size") is not None and \
            _differs(s["world_size"], facts.n):
        return (f"{name}: world_size {_show(s['world_size'])}, the point runs on "
                f"n={_fmt(facts.n)}")
    return _layout_vs_point(s, facts, name)


def env_vs_point(e: dict, facts: PointFacts, name: str = "env.json") -> str | None:
    """Why a sound ``env.json`` is not the point's run (None: it is): its ``world_size``, its
    number of ``ranks`` or its ``layout`` is not the point's."""
    if facts.n is not None:
        if e.get("world_size") is not None and _differs(e["world_size"], facts.n):
            return (f"{name}: world_size {_show(e['world_size'])}, the point runs on "
                    f"n={_fmt(facts.n)} ranks")
        ranks = e.get("ranks")
        if isinstance(ranks, list) and len(ranks) != facts.n:
            return f"{name}: {len(ranks)} ranks recorded, the point runs on n={_fmt(facts.n)}"
    return _layout_vs_point(e, facts, name)


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
    _check(e, name, "hosts", lambda v: isinstance(v, list) and all(isinstance(h, str) for h in v),
           "a list of host names")
    for k in ("device_name", "torch", "cuda", "rocm", "nccl", "git_commit", "python",
              "platform", "config_hash", "device_type", "backend"):
        _check(e, name, k, _str, "text")
    _check(e, name, "slurm", lambda v: isinstance(v, dict) and all(isinstance(x, str)
                                                                     for x in v.values()),
           "a table of text")
    _check(e, name, "world_size", lambda v: is_int(v) and v > 0, "an integer > 0")
    _check(e, name, "ranks", lambda v: isinstance(v, list), "a list of ranks")
    _check(e, name, "layout", _layout, "a table of whole numbers (dp, tp, pp, cp)")
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
        _check(c, name, "flops_per_s", positive, "a positive number of FLOP/s", optional=False)
        for k in ("dtype", "device_type", "device_name"):
            _check(c, name, k, _str, "text")
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
        _check(s, name, k, _str, "text")
    for k, kind, what in (("series", list, "a list"), ("train", dict, "an object"),
                          ("platform", dict, "an object"), ("report", dict, "an object"),
                          ("references", list, "a list")):
        _check(s, name, k, lambda v, kind=kind: isinstance(v, kind), what)
    for i, ser in enumerate(s.get("series") or []):
        if not isinstance(ser, dict) or not isinstance(ser.get("name"), str):
            raise RecordError(f"{name}: series[{i}] is not a series with a name")
        _check(ser, name, "baseline", lambda v: is_int(v) and v > 0, "an integer > 0")
    if not all(isinstance(r, str) for r in s.get("references") or []):
        raise RecordError(f"{name}: references must be names")
    train = s.get("train") or {}
    _check(train, name, "steps", lambda v: is_int(v) and v > 0, "an integer > 0")
    plat = s.get("platform") or {}
    _check(plat, name, "timeout_s", positive, "a positive number of seconds")
    _check(plat, name, "device", _str, "text")
    return s


# --- plan.tsv --------------------------------------------------------------------------------

#: Columns a plan must have, and the integer ones among them.
PLAN_REQUIRED = ("point_id", "series", "mode", "n", "feasible")
PLAN_INTS = ("n", "dp", "tp", "pp", "nodes", "procs_per_node", "micro_batch", "grad_accum",
             "global_batch", "seq_len", "repeat", "baseline_n", "virtual_stages")
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
            if v != "" and not _whole(v):
                raise RecordError(f"plan.tsv line {i}: {c} {v!r} is not a whole number; {fix}")
        if not _whole(row["n"]) or float(row["n"]) < 1:
            raise RecordError(f"plan.tsv line {i}: n {row['n']!r} is not a count >= 1; {fix}")
        for c in PLAN_POSITIVE:
            v = row.get(c, "")
            if v != "" and not _positive_text(v):
                raise RecordError(f"plan.tsv line {i}: {c} {v!r} is not a positive number; {fix}")
        rows.append(row)
    return rows


def _whole(v: str) -> bool:
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
