"""The study as the trackers hold it, written once for all of them: a run per point (each
repeat) whose parameters are its ``plan.tsv`` layout and settings, whose metrics are its steps
and its ``runs.csv`` summary, with its state, reason, point id, git commit and host; and the
study's own run: each series' efficiency curve and measured breakdown per N, the figures and
``summary.md``. Read from the finished study's folder (after the aggregate); nothing here
imports a tracker.

Every run carries a digest of what it exports (:func:`digest`): a tracker that already holds a
run of that point id with that digest is left as it is, so exporting again adds nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from scalestudy.record.run_records import parse_steps, read_env, read_plan, read_study
from scalestudy.record.bounded_read import RecordError, read_text

#: Bumped when what a run exports changes shape (every run is then written again).
FORMAT = 1
#: ``plan.tsv`` columns that judge or label a point rather than set it: tags, not parameters.
NOT_PARAMS = ("point_id", "config_hash", "feasible", "reason", "mem_estimate_gb", "baseline_n")
#: ``runs.csv`` columns exported as a run's summary metrics (units in their names; empty
#: cells, e.g. MFU without a spec peak or energy without a meter, are left out, never zero).
SUMMARY = ("step_time_median_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "step_time_iqr_s",
           "n_steady_steps", "tokens_per_s", "tokens_per_s_per_device",
           "model_tflops_per_device", "hardware_tflops_per_device", "mfu", "hfu",
           "util_vs_measured_ceiling", "peak_memory_gb", "joules_per_token", "avg_power_w",
           "loss_first", "loss_last", "wall_s", "rank_spread")
#: Per-step metrics of ``steps.jsonl`` (their step is the optimizer step).
STEP_METRICS = ("step_time_s", "loss")
#: ``efficiency.csv`` columns logged per N on each series' curve.
CURVE = ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup", "ideal_speedup",
         "step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "tokens_per_s_per_device",
         "mfu", "hfu", "util_vs_measured_ceiling")
#: The study's own run's name in every tracker.
STUDY_RUN = "study"


@dataclass
class RunShape:
    """One point's run: ``params`` (text, as ``plan.tsv`` holds them), ``tags`` (text),
    ``summary`` (name -> number), ``steps`` (one ``{step, step_time_s, loss}`` per logged
    step; seconds, loss in nats)."""

    point_id: str
    state: str  # ok, oom, timeout, crashed, infeasible, invalid, ... (runs.csv status)
    reason: str  # why it is not ok ("" when ok)
    params: dict[str, str]
    tags: dict[str, str]
    summary: dict[str, float]
    steps: list[dict] = field(default_factory=list)

    @property
    def digest(self) -> str:
        return digest([FORMAT, self.point_id, self.state, self.reason, self.params, self.tags,
                       self.summary, self.steps])


@dataclass
class StudyShape:
    """The study: its name, point runs, curves (series -> [(N, {metric: value})]), measured
    breakdown (series -> [(N, {term: seconds per step})]), efficiency lost per term (series
    -> [(N, {term: share of 1 - E})]), figures (paths) and ``summary.md`` (path or None)."""

    name: str
    folder: Path
    runs: list[RunShape]
    curves: dict[str, list[tuple[int, dict[str, float]]]]
    breakdown: dict[str, list[tuple[int, dict[str, float]]]]
    loss: dict[str, list[tuple[int, dict[str, float]]]]
    figures: list[Path]
    summary_md: Path | None
    tags: dict[str, str]

    @property
    def digest(self) -> str:
        """Of what the study's own run exports (its curves, tables, files, and the names of
        its points' parameters and metrics, which the TensorBoard HParams table lists)."""
        files = [(p.name, hashlib.sha256(p.read_bytes()).hexdigest())
                 for p in [*self.figures, *([self.summary_md] if self.summary_md else [])]]
        names = sorted({f"{k}" for r in self.runs for k in (*r.params, *r.summary)})
        return digest([FORMAT, self.name, self.curves, self.breakdown, self.loss, files,
                       self.tags, names])


def digest(obj) -> str:
    """SHA-256 (hex) of ``obj`` as canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _number(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _table(folder: Path, name: str) -> pd.DataFrame:
    path = folder / name
    if not path.is_file():
        raise RecordError(f"{path}: missing; run the study's aggregate first "
                          "(scalestudy aggregate RESULTS/STUDY)")
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _steps(run_dir: Path) -> list[dict]:
    """The sound lines of a run's ``steps.jsonl`` (a damaged file: those before the damage)."""
    try:
        text = read_text(run_dir / "steps.jsonl")
    except RecordError:
        return []
    if text is None:
        return []
    records, _ = parse_steps(text, "steps.jsonl")
    return [{"step": int(r["step"]), **{k: float(r[k]) for k in STEP_METRICS
                                        if _number(r.get(k)) is not None}}
            for r in records]


def read_run(folder: Path, row: dict, plan_row: dict | None) -> RunShape:
    """The run of one ``runs.csv`` row (``plan_row``: its ``plan.tsv`` row)."""
    pid = row["point_id"]
    run_dir = folder / "runs" / pid
    params = {k: v for k, v in (plan_row or {}).items() if k not in NOT_PARAMS and v != ""}
    env, _ = read_env(run_dir) if run_dir.is_dir() else (None, None)
    env = env or {}
    tags = {"point_id": pid, "config_hash": row.get("config_hash", ""),
            "series": row.get("series", ""), "mode": row.get("mode", ""),
            "study": row.get("study", ""), "state": row.get("status", ""),
            "git_commit": str(env.get("git_commit") or ""),
            "host": ",".join(str(h) for h in env.get("hosts") or [])}
    summary = {k: x for k in SUMMARY if (x := _number(row.get(k))) is not None}
    return RunShape(point_id=pid, state=row.get("status", ""), reason=row.get("reason", ""),
                    params=params, tags={k: v for k, v in tags.items() if v},
                    summary=summary, steps=_steps(run_dir) if run_dir.is_dir() else [])


def _per_n(df: pd.DataFrame, key: str, value: str | tuple[str, ...], where=None
           ) -> dict[str, list[tuple[int, dict[str, float]]]]:
    """series -> [(N, {name: number})]: ``value`` columns by name, or one column ``value``
    named by the ``key`` column (a long table such as breakdown.csv)."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for r in df.to_dict("records"):
        if where is not None and not where(r):
            continue
        n = _number(r.get("n"))
        if n is None:
            continue
        got = out.setdefault(r["series"], {}).setdefault(int(n), {})
        if isinstance(value, tuple):
            got.update({c: x for c in value if (x := _number(r.get(c))) is not None})
        elif (x := _number(r.get(value))) is not None:
            got[r[key]] = x
    return {s: sorted(by_n.items()) for s, by_n in out.items()}


def read_study_shape(folder: str | os.PathLike) -> StudyShape:
    """The study of the finished results folder ``folder`` (RESULTS/<study>); RecordError
    (one line) when its tables are missing or damaged."""
    folder = Path(folder)
    runs = _table(folder, "runs.csv")
    plan = {r["point_id"]: r for r in read_plan(folder) or []}
    doc = read_study(folder) or {}
    name = str(doc.get("name") or (runs["study"].iloc[0] if len(runs) else folder.name))
    efficiency = _table(folder, "efficiency.csv")
    breakdown = (_table(folder, "breakdown.csv") if (folder / "breakdown.csv").is_file()
                 else pd.DataFrame())
    loss = (_table(folder, "efficiency_loss.csv")
            if (folder / "efficiency_loss.csv").is_file() else pd.DataFrame())
    figures = sorted((folder / "figures").glob("*.png")) if (folder / "figures").is_dir() else []
    summary = folder / "summary.md"
    shapes = [read_run(folder, row, plan.get(row["point_id"]))
              for row in runs.to_dict("records")]
    commits = sorted({r.tags["git_commit"] for r in shapes if "git_commit" in r.tags})
    return StudyShape(
        name=name, folder=folder, runs=shapes,
        curves=_per_n(efficiency, "", CURVE),
        breakdown=_per_n(breakdown, "term", "measured_s",
                         where=lambda r: str(r.get("in_step")) == "True"),
        loss=_per_n(loss, "term", "measured_loss"), figures=figures,
        summary_md=summary if summary.is_file() else None,
        tags={"study": name, "kind": "study", "git_commit": ",".join(commits),
              "points": str(len(shapes)),
              "ok": str(sum(r.state == "ok" for r in shapes))})
