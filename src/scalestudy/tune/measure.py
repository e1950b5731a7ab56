"""Measuring trials as points of the pipeline: the layouts of one fidelity rung are the series
of a rung study (``tune.space.rung_study``), written under ``results/<study>/tune/studies/`` and
run by Snakemake (``run.snakemake.launch``: the same planner, runner, records, point ids and
profiles as ``scalestudy run``); only the new points' ``status.json`` are asked for, so a point
already measured is reused, never rerun. Outcomes come from the records through the one reader
(``analysis.aggregate.collect``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from scalestudy.config.study_yaml import StudyError, dump_study
from scalestudy.config.studyspec import Study
from scalestudy.record.io import write_text
from scalestudy.record.states import RunState
from scalestudy.tune.space import TrialLayout, rung_study


@dataclass(frozen=True)
class Outcome:
    """What one run of a layout at one fidelity gave: its state and reason, tokens/s per device
    (median steady step), peak memory (GB), wall time (s), the point id, and whether its record
    existed before the search asked for it (``reused``: nothing ran)."""

    state: RunState
    reason: str
    tokens_per_s_per_device: float
    peak_memory_gb: float
    wall_s: float
    point_id: str
    reused: bool


@dataclass
class SnakemakeTrials:
    """Runs the trials of a tuning study through Snakemake, rung by rung: ``study`` (loaded
    from ``study_file``), ``tune_dir`` (``results/<study>/tune``), Snakemake's ``profile`` and
    extra arguments, ``trust_site`` as ``scalestudy run --trust-site``."""

    study: Study
    study_file: str
    tune_dir: Path
    profile: str
    extra: list[str] = field(default_factory=list)
    trust_site: bool = False
    layouts: dict[int, list[TrialLayout]] = field(default_factory=dict)  # every layout asked, by rung

    @property
    def results(self) -> Path:
        """The results root of the rung studies."""
        return self.tune_dir / "runs"

    def rung_file(self, steps: int) -> Path:
        return self.tune_dir / "studies" / f"s{steps}.yaml"

    def __call__(self, batch: list[tuple[TrialLayout, int]]) -> dict[tuple[TrialLayout, int], Outcome]:
        """Measure every ``(layout, steps)`` of ``batch`` (one Snakemake run per rung)."""
        from scalestudy.analysis.aggregate import collect
        from scalestudy.plan.planner import plan_points
        from scalestudy.run.snakemake import launch

        out = {}
        for steps in sorted({s for _, s in batch}):
            want = [lay for lay, s in batch if s == steps]
            known = self.layouts.setdefault(steps, [])
            known += [lay for lay in want if lay not in known]
            rung = rung_study(self.study, known, steps)
            path = self.rung_file(steps)
            write_text(path, f"# written by `scalestudy tune {self.study_file} --measure`\n"
                       + dump_study(rung.to_json(), sort_keys=False))
            names = {lay.name for lay in want}
            points = [p for p in plan_points(rung, str(path)) if p.series in names]
            study_dir = self.results / rung.name
            done_before = {p.point_id for p in points
                           if (study_dir / "runs" / p.point_id / "status.json").exists()}
            targets = [str((study_dir / "runs" / p.point_id / "status.json").resolve())
                       for p in points if p.feasible and p.point_id not in done_before]
            if targets:
                rc = launch(str(path), rung, str(self.results), self.profile,
                            [*self.extra, f"{study_dir.resolve()}/plan.tsv", *targets],
                            self.trust_site)
                if rc < 0 or rc == 130:
                    raise KeyboardInterrupt  # stopped: the search goes on from its journal
            elif not (study_dir / "plan.tsv").exists():
                raise StudyError(f"{path}: no point to run")
            runs, _, _ = collect(study_dir)
            by_point = {r["point_id"]: r for r in runs.to_dict("records")}
            for lay in want:
                # one repeat per layout is enough to read; with repeats, the median of the ok ones
                mine = [by_point[p.point_id] for p in points if p.series == lay.name
                        and p.point_id in by_point]
                out[(lay, steps)] = _outcome(mine, done_before)
        return out


def _outcome(rows: list[dict], done_before: set[str]) -> Outcome:
    """One layout's outcome from its runs' rows (``runs.csv`` columns): the median
    tokens/s per device of its ok repeats, else the first failure."""
    if not rows:
        return Outcome(RunState.NOT_RUN, "no record", math.nan, math.nan, 0.0, "", False)
    ok = [r for r in rows if r["status"] == RunState.OK]
    pick = ok or rows
    rates = sorted(float(r["tokens_per_s_per_device"]) for r in ok)
    rate = rates[(len(rates) - 1) // 2] if rates else 0.0
    first = pick[0]
    wall = sum(float(r["wall_s"]) for r in rows
               if r["point_id"] not in done_before and _finite(r.get("wall_s")))
    mem = first.get("peak_memory_gb")
    return Outcome(RunState(first["status"]), str(first.get("reason") or ""), rate,
                   float(mem) if _finite(mem) else math.nan, wall, str(first["point_id"]),
                   all(r["point_id"] in done_before for r in rows))


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False
