"""``scalestudy status``: how far a study is, which points failed and why, how long is left.

    scalestudy status [STUDY.yaml | RESULTS/STUDY] [--results DIR] [--json] [--watch [S]]

Reads only the run records, so it works from another terminal while Snakemake runs, locally
or on Slurm (the records live on the shared file system): ``plan.tsv`` (else the study file's
plan), ``study.json``, ``calibration.json`` and per point ``runs/<id>/``: ``status.json``
(written last by the runner), ``steps.jsonl``, ``stdout.log``. A point is

- **ok** / **failed** (``oom``, ``timeout``, ``crashed``, ``invalid``): its ``status.json``;
  an ok point whose ranks were out of step beyond ``platform.straggler_ratio`` is listed as
  flagged, with the rank and host that held the others up (``scalestudy.record.stragglers``);
- **running**: its ``stdout.log`` exists without a ``status.json`` (the runner opened the log:
  the attempt started); it has been running since its folder last changed (the runner
  clears the previous attempt's records and opens the log when it starts);
- **interrupted**: like running, but nothing in its folder changed for longer than the
  watchdog (``platform.timeout_s``) allows a live attempt: a killed run left it; the next
  ``scalestudy run`` reruns it;
- **pending**: planned and feasible, not started; **infeasible**: rejected by the planner.

Time left: every unfinished point's wall time is estimated as start-up + steps × step time.
The step time is the performance model's (``perf.stepmodel.predict_step_time`` on the study's
hardware: ``cpu-local`` with the study's own ``calibration.json`` matmul rates for a CPU
study, the system preset of ``platform.hardware`` on a GPU), scaled by the median
measured/predicted ratio of the points that finished; the start-up is the median of the
finished points' wall time minus their summed step times (at the same N when one finished).
Without a model the median wall time of the finished points stands in. The sum of the
unfinished points' estimates (a running point's minus its elapsed time) is divided by the
number of points running now (1 when none): the time left at the current concurrency.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from statistics import median

from scalestudy.number_format import finite
from scalestudy.config.studyspec import Study
from scalestudy.record.run_records import read_env, read_plan, read_point, read_status, read_summary, read_steps, read_study
from scalestudy.record.bounded_read import RecordError, printable, read_tail
from scalestudy.record import stragglers
from scalestudy.record.source import refuse_other_source
from scalestudy.record.states import FAILED, RunState

#: What status adds to the run states.
RUNNING, PENDING, INTERRUPTED = "running", "pending", "interrupted"
#: Order of the states in the summary line.
ORDER = ("ok", *(str(s) for s in FAILED), "invalid", RUNNING, INTERRUPTED, PENDING, "infeasible")
#: Seconds beyond ``platform.timeout_s`` after which a silent running point counts as interrupted
#: (the runner's kill grace and the writing of its records).
STALE_GRACE_S = 60.0
_ERROR_LINE = re.compile(r"(Error|Exception|error:|Traceback|Killed|Timed out|timed out|"
                         r"can't allocate|out of memory)")


@dataclass
class PointStatus:
    point_id: str
    series: str
    mode: str
    n: int
    repeat: int
    state: str
    reason: str = ""
    last_error: str = ""
    wall_s: float | None = None  # a finished point's wall time (status.json)
    elapsed_s: float | None = None  # a running point's time so far
    estimate_s: float | None = None  # an unfinished point's estimated remaining wall time
    over_estimate: bool = False  # a running point that has run longer than its estimate
    straggler: str = ""  # an ok point shaped by a straggler: the note (record/stragglers.py)


@dataclass
class StudyStatus:
    study: str
    study_dir: str
    now: str
    counts: dict
    series: list = field(default_factory=list)
    points: list = field(default_factory=list)
    elapsed_s: float | None = None
    busy_s: float = 0.0
    time_left_s: float | None = None
    estimate: str = ""

    @property
    def done(self) -> bool:
        return not (self.counts.get(RUNNING) or self.counts.get(PENDING))


# --- reading the records ---------------------------------------------------------------------


def resolve(target: str | None, results: str = "results") -> tuple[Path, Study | None]:
    """The study folder of ``target`` (a study file, a study's results folder, or a results
    root holding one study) and the validated study when a study file was given."""
    from scalestudy.config.study import load_study
    from scalestudy.config.study_yaml import StudyError

    if target is None:  # the default study: the checkout's, else the installed package's
        from scalestudy import paths

        target = "workflow/config/default.yaml"
        if not Path(target).is_file():
            target = str(paths.workflow_dir() / "config" / "default.yaml")
    p = Path(target)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        study = load_study(p)
        try:  # the folder of another study file with the same name is not this study's
            refuse_other_source(Path(results) / study.name, p, study.to_json())
        except RecordError as e:
            raise StudyError(str(e)) from None
        return Path(results) / study.name, study
    if (p / "plan.tsv").is_file() or (p / "study.json").is_file():
        return p, None
    if p.is_dir():
        inside = sorted(d for d in p.iterdir() if (d / "plan.tsv").is_file())
        if len(inside) == 1:
            return inside[0], None
        if inside:
            raise StudyError(f"{p}: holds several studies ({', '.join(d.name for d in inside)}); "
                             "name one, e.g. scalestudy status " + str(inside[0]))
    raise StudyError(f"{target}: neither a study file nor a study's results folder "
                     "(one with plan.tsv); run `scalestudy run STUDY.yaml` first")


def _plan_rows(study_dir: Path, study: Study | None) -> list[dict]:
    """Rows of ``plan.tsv``; the study's own plan when the file is not written yet."""
    rows = read_plan(study_dir)  # RecordError: a cut, duplicated or damaged plan (one line)
    if rows is not None:
        return rows
    if study is None:
        return []
    from scalestudy.plan.planner import plan_points, plan_rows

    return [{k: "" if v is None else str(v) for k, v in r.items()}
            for r in plan_rows(plan_points(study))]


def _last_error(log: Path, n_bytes: int = 65536) -> str:
    """The last line of ``stdout.log`` that reads like an error ("" when none)."""
    lines = read_tail(log, n_bytes).splitlines()
    for ln in reversed(lines):
        if _ERROR_LINE.search(ln) and "ChildFailedError" not in ln:
            return ln.strip()[:300]
    return ""


def _iso(ts: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(ts)).timestamp()
    except (TypeError, ValueError):
        return None


@dataclass
class _Finished:
    """What a finished ok point tells the estimate."""

    n: int
    wall_s: float
    steps_s: float  # sum of its step times
    median_step_s: float


def read_points(study_dir: Path, rows: list[dict], timeout_s: float, now: float
                ) -> tuple[list[PointStatus], dict[str, _Finished], float | None, float | None]:
    """Each planned run's state; the measurements of the finished ok ones; the earliest start
    and the latest finish of a point."""
    runs = study_dir / "runs"
    try:
        present = set(os.listdir(runs))
    except OSError:
        present = set()
    points, finished, starts, ends = [], {}, [], []
    for r in rows:
        pid = r.get("point_id", "")
        ps = PointStatus(point_id=pid, series=r.get("series", ""), mode=r.get("mode", ""),
                         n=int(float(r.get("n") or 0)), repeat=int(float(r.get("repeat") or 0)),
                         state=PENDING)
        points.append(ps)
        if str(r.get("feasible", "True")).lower() not in ("true", "1", "yes"):
            ps.state, ps.reason = str(RunState.INFEASIBLE), r.get("reason", "")
            continue
        if pid not in present:
            continue
        d = runs / pid
        status, damaged = read_status(d)
        if damaged:  # the next `scalestudy run` reruns it
            ps.state, ps.reason = str(RunState.INVALID), f"{damaged} (rerun by scalestudy run)"
            continue
        if status is not None:
            ps.state = str(RunState(status["state"]))
            ps.reason = str(status.get("reason") or "")
            ps.wall_s = finite(status.get("wall_s"))
            t, e = _iso(status.get("started")), _iso(status.get("finished"))
            if t is not None:
                starts.append(t)
            if e is not None:
                ends.append(e)
            if ps.state == RunState.OK:
                point, why = read_point(d, pid, r.get("config_hash") or None)
                steps = None
                summary, why_summary = read_summary(d, pid, r.get("config_hash") or None, point)
                why = why or why_summary \
                    or read_env(d, point)[1]  # the records aggregate reads, checked alike
                if not why:
                    steps, why = read_steps(d / "steps.jsonl", point=point)
                if why:
                    ps.state, ps.reason = str(RunState.INVALID), f"status ok but {why}"
                    continue
                ps.straggler = stragglers.columns((summary or {}).get(stragglers.SUMMARY_KEY),
                                                  stragglers.threshold(point))["straggler_note"]
                steady = steps.steady()
                if steady and ps.wall_s is not None:
                    finished[pid] = _Finished(ps.n, ps.wall_s, sum(steps.times), median(steady))
            elif ps.state != RunState.INVALID or (d / "stdout.log").exists():
                ps.last_error = _last_error(d / "stdout.log")
            continue
        if (d / "stdout.log").exists():
            try:
                last = max((d / "stdout.log").stat().st_mtime, d.stat().st_mtime)
                began = d.stat().st_mtime
            except OSError:
                continue
            if now - last > timeout_s + STALE_GRACE_S:
                ps.state = INTERRUPTED
                ps.reason = (f"no status.json and nothing written for {_dur(now - last)} "
                             f"(> platform.timeout_s={timeout_s:g} s): a killed run left it; "
                             "the next run reruns it")
            else:
                ps.state = RUNNING
                ps.elapsed_s = max(0.0, now - began)
                starts.append(began)
    return points, finished, (min(starts) if starts else None), (max(ends) if ends else None)


# --- the estimate ----------------------------------------------------------------------------


def _model(study: Study | None, study_dir: Path):
    """``(hardware spec, measured building blocks, description)`` for the performance model,
    or ``(None, None, why not)``: the inputs ``scalestudy predict`` prices the study with
    (``perf.inputs.model_inputs``)."""
    from scalestudy.perf.inputs import model_inputs

    if not study:
        return None, None, "no study.json"
    try:
        mi = model_inputs(study, study_dir)
    except (OSError, ValueError, KeyError) as e:
        return None, None, f"model unavailable: {e}"
    return mi.hw, mi.measured, mi.source


def _predicted(study: Study | None, hw, measured, wanted: set[str]) -> dict[str, float]:
    """Predicted step time (s) of the wanted points (ids) of the study."""
    if hw is None or not wanted:
        return {}
    from scalestudy.perf.stepmodel import predict_step_time
    from scalestudy.plan.planner import plan_points

    out = {}
    try:
        points = plan_points(study)
    except Exception:  # noqa: BLE001 - a study that no longer plans: no model estimate
        return {}
    for p in points:
        if p.point_id in wanted and p.feasible:
            try:
                out[p.point_id] = float(predict_step_time(p, hw, measured).step_time_s)
            except (ValueError, KeyError, ZeroDivisionError):
                continue
    return out


def time_left(points: list[PointStatus], finished: dict[str, _Finished], steps: dict[str, int],
             predicted: dict[str, float], model: str = "") -> tuple[float | None, str]:
    """Fill ``estimate_s`` of every unfinished point; return the time left (s) at the current
    concurrency and how it was estimated (module doc)."""
    todo = [p for p in points if p.state in (RUNNING, PENDING, INTERRUPTED)]
    if not todo:
        return 0.0, "nothing left to run"
    fin = list(finished.values())
    ratios = [finished[k].median_step_s / predicted[k] for k in finished if predicted.get(k)]
    scale = median(ratios) if ratios else 1.0
    startup_all = [max(0.0, f.wall_s - f.steps_s) for f in fin]
    for p in todo:
        if p.point_id in predicted:
            same_n = [max(0.0, f.wall_s - f.steps_s) for f in fin if f.n == p.n]
            startup = median(same_n or startup_all) if fin else 0.0
            total = startup + steps.get(p.point_id, 0) * predicted[p.point_id] * scale
        elif fin:
            same_n = [f.wall_s for f in fin if f.n == p.n]
            total = median(same_n or [f.wall_s for f in fin])
        else:
            continue
        p.estimate_s = max(0.0, total - (p.elapsed_s or 0.0))
        p.over_estimate = p.elapsed_s is not None and p.elapsed_s > total
    known = [p.estimate_s for p in todo if p.estimate_s is not None]
    if len(known) < len(todo):
        return None, ("no estimate yet: no point has finished and the performance model "
                      "cannot price this study")
    if predicted:
        model = f" ({model})" if model else ""
        how = (f"performance model{model} x{scale:.2f} (median measured/predicted of {len(ratios)} "
               f"finished point(s)) + measured start-up" if ratios else
               f"performance model{model} alone (no point finished yet: start-up not included)")
    else:
        how = f"median wall time of {len(fin)} finished point(s)"
    running = sum(p.state == RUNNING for p in points)
    return sum(known) / max(1, running), how + f"; {max(1, running)} point(s) at a time"


# --- the whole status ------------------------------------------------------------------------


def _recorded(record: dict | None) -> Study | None:
    """The study of a ``study.json`` record (None: none, or one another version wrote)."""
    if record is None:
        return None
    try:
        return Study.from_validated(record)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def snapshot(study_dir: Path, study: Study | None = None, now: float | None = None,
             _cache: dict | None = None) -> StudyStatus:
    """The status of the study in ``study_dir`` (``study``: the validated study file, when
    given; else ``study.json``). ``_cache`` keeps the model's predictions between refreshes."""
    now = time.time() if now is None else now
    study_dir = Path(study_dir)
    record = read_study(study_dir)  # RecordError: damaged (one line)
    resolved = _recorded(record) or study
    rows = _plan_rows(study_dir, study or resolved)
    timeout_s = float(resolved.platform.timeout_s) if resolved else 900.0
    points, finished, first, last = read_points(study_dir, rows, timeout_s, now)

    steps = {}
    for r in rows:
        steps[r.get("point_id", "")] = resolved.train.steps if resolved else 0
    cache = _cache if _cache is not None else {}
    wanted = {p.point_id for p in points if p.state not in ("infeasible",)}
    if "predicted" not in cache:
        hw, measured, what = _model(resolved, study_dir)
        cache["predicted"] = _predicted(resolved, hw, measured, wanted)
        cache["model"] = what
    left, how = time_left(points, finished, steps, cache["predicted"], cache["model"])

    counts = {s: 0 for s in ORDER}
    for p in points:
        counts[p.state] = counts.get(p.state, 0) + 1
    by_series: dict[str, dict] = {}
    for p in points:
        s = by_series.setdefault(p.series, {"series": p.series, "mode": p.mode,
                                            **{k: 0 for k in ORDER}})
        s[p.state] = s.get(p.state, 0) + 1
    name = resolved.name if resolved else (record or {}).get("name") or study_dir.name
    live = counts.get(RUNNING) or counts.get(PENDING) or counts.get(INTERRUPTED)
    end = now if live or last is None else last  # a finished study: until its last point
    return StudyStatus(
        study=name, study_dir=str(study_dir),
        now=datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
        counts=counts, series=list(by_series.values()), points=points,
        elapsed_s=None if first is None else max(0.0, end - first),
        busy_s=sum(p.wall_s or 0.0 for p in points) + sum(p.elapsed_s or 0.0 for p in points),
        time_left_s=left, estimate=how)


# --- output ----------------------------------------------------------------------------------


def _dur(s: float | None) -> str:
    if s is None:
        return "–"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _failed(p: PointStatus) -> bool:
    return p.state in {str(s) for s in FAILED} | {"invalid"}


def text(st: StudyStatus, limit: int = 20) -> str:
    """The human-readable status (what ``scalestudy status`` prints)."""
    c = st.counts
    planned = sum(c.values())
    n_failed = sum(c.get(str(s), 0) for s in FAILED) + c.get("invalid", 0)
    fail_by = ", ".join(f"{k} {c[k]}" for k in (*(str(s) for s in FAILED), "invalid") if c.get(k))
    parts = [f"{c.get('ok', 0)} ok", f"{n_failed} failed" + (f" ({fail_by})" if fail_by else ""),
             f"{c.get(RUNNING, 0)} running", f"{c.get(PENDING, 0)} pending"]
    if c.get(INTERRUPTED):
        parts.append(f"{c[INTERRUPTED]} interrupted")
    if c.get("infeasible"):
        parts.append(f"{c['infeasible']} infeasible")
    n_flagged = sum(1 for p in st.points if p.straggler)
    if n_flagged:
        parts.append(f"{n_flagged} ok but flagged (straggler)")
    out = [f"study {st.study} ({st.study_dir}) at {st.now}: {planned} planned runs",
           "  " + ", ".join(parts)]
    left = ("done" if st.done else
            f"about {_dur(st.time_left_s)} left ({st.estimate})" if st.time_left_s is not None
            else st.estimate)
    live = not st.done or c.get(INTERRUPTED)
    span = ("since the first point started" if live else
            "from the first point's start to the last one's end")
    out.append(f"  elapsed {_dur(st.elapsed_s)} {span} ({_dur(st.busy_s)} in points); {left}")
    out.append("")
    head = ["series", "mode", "ok", "failed", "running", "pending", "infeasible"]
    table = [head]
    for s in st.series:
        fails = sum(s.get(str(k), 0) for k in FAILED) + s.get("invalid", 0)
        table.append([s["series"], s["mode"], str(s.get("ok", 0)), str(fails),
                      str(s.get(RUNNING, 0)), str(s.get(PENDING, 0) + s.get(INTERRUPTED, 0)),
                      str(s.get("infeasible", 0))])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    out += ["  " + "  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip() for r in table]

    def listing(title: str, pts: list[PointStatus], line) -> None:
        if not pts:
            return
        out.extend(["", f"{title}:"])
        for p in pts[:limit]:
            out.extend(line(p))
        if len(pts) > limit:
            out.append(f"  ... and {len(pts) - limit} more (--json lists all)")

    running = [p for p in st.points if p.state == RUNNING]
    listing("running", running, lambda p: [
        f"  {p.series} N={p.n} r{p.repeat}  {p.point_id}  running {_dur(p.elapsed_s)}"
        + (", past its estimate" if p.over_estimate else
           f", about {_dur(p.estimate_s)} left" if p.estimate_s is not None else "")])
    failed = [p for p in st.points if _failed(p)]

    def fail_line(p):
        lines = [f"  {p.series} N={p.n} r{p.repeat}  {p.state}: {p.reason or '(no reason)'}"]
        if p.last_error and p.last_error not in p.reason:
            lines.append(f"      last error: {p.last_error}")
        lines.append(f"      {p.point_id}")
        return lines
    listing("failed", failed, fail_line)
    listing("interrupted", [p for p in st.points if p.state == INTERRUPTED],
            lambda p: [f"  {p.series} N={p.n} r{p.repeat}  {p.reason}"])
    listing("ok but flagged", [p for p in st.points if p.straggler],
            lambda p: [f"  {p.series} N={p.n} r{p.repeat}  {p.straggler}", f"      {p.point_id}"])
    return printable("\n".join(out)) + "\n"  # no escape sequence of a log reaches the terminal


def as_json(st: StudyStatus) -> str:
    d = asdict(st)
    d["done"] = st.done
    return json.dumps(d, indent=1, default=str) + "\n"
