"""The search loop: ask the engine for layouts, measure them rung by rung, tell it what they
gave, until the budget is spent; every evaluation is a row of ``tune/trials.csv``
(``record.trials``), rewritten after each batch.

A batch holds up to ``tune.parallel`` trials: new ones asked from the engine while the budget
allows, and those promoted to their next fidelity rung. The budget counts the layouts measured
(``tune.trials``) and the device-hours of the runs that ran (``tune.device_hours``); a layout
the planner refuses, or one an earlier trial measured, costs nothing and is not counted. At
most :data:`MAX_ASKS_PER_TRIAL` asks per budgeted trial: a space the planner refuses almost
entirely ends the search instead of sampling forever."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from scalestudy.config.studyspec import Study
from scalestudy.record.states import RunState
from scalestudy.record.trials import TRIAL_COLUMNS, TrialState
from scalestudy.tune.engine import SearchEngine, Trial
from scalestudy.tune.measure import Outcome
from scalestudy.tune.space import TrialLayout

#: Asks per budgeted trial before the search gives up on a space that is mostly refused.
MAX_ASKS_PER_TRIAL = 50

Evaluate = Callable[[list[tuple[TrialLayout, int]]], dict[tuple[TrialLayout, int], Outcome]]


class MeasuredLayout(NamedTuple):
    """What a measured layout gave: its state, the tokens/s per device told the engine, the
    reason, the steps run and the trial that measured it (None: unknown)."""

    state: TrialState
    value: float
    reason: str
    steps: int
    trial: int | None


def duplicate_reason(m: MeasuredLayout) -> str:
    """The reason of a trial answered from an earlier one: the source trial, its state, the
    value it gave (tokens/s per device) and its reason; never a missing value's ``nan``."""
    source = f"trial {m.trial}" if m.trial is not None else "an earlier trial"
    value = f", {m.value:.4g} tokens/s per device" if _finite(m.value) else ""
    return f"measured by {source}: {m.state}{value}" + (f" ({m.reason})" if m.reason else "")


@dataclass
class Search:
    """One layout search: ``study`` (with its ``tune``), the ``engine``, the fidelity
    ``rungs`` (steps), the layouts the planner accepts (``feasible``) or refuses with the
    reason (``refused``), the model's predicted tokens/s per device of each accepted layout
    (``predicted``; empty when the model cannot price the study), and ``evaluate``, which
    measures a batch."""

    study: Study
    engine: SearchEngine
    rungs: list[int]
    feasible: set[TrialLayout]
    refused: dict[TrialLayout, str]
    predicted: dict[TrialLayout, float]
    evaluate: Evaluate
    capacity_gb: float | None = None  # memory per device (the planner's memory rule)
    rows: list[dict] = field(default_factory=list)
    #: what each measured layout gave
    measured: dict[TrialLayout, MeasuredLayout] = field(default_factory=dict)
    write: Callable[[list[dict]], None] = lambda rows: None

    @property
    def layouts_measured(self) -> int:
        return len({r["layout"] for r in self.rows if r["state"] not in
                    (TrialState.REFUSED, TrialState.DUPLICATE)})

    @property
    def device_hours(self) -> float:
        return sum(r["device_hours"] for r in self.rows if _finite(r["device_hours"]))

    def budget_left(self) -> bool:
        t = self.study.tune
        return (self.layouts_measured < t.trials
                and (t.device_hours is None or self.device_hours < t.device_hours))

    def warm_start(self) -> None:
        """On a new search, enqueue the model's ``tune.warm_start`` best predicted layouts."""
        if not self.engine.fresh():
            return
        best = sorted(self.predicted, key=lambda lay: (-self.predicted[lay], lay.name))
        for lay in best[:self.study.tune.warm_start]:
            self.engine.enqueue(lay)

    def run(self) -> list[dict]:
        """Search until the budget is spent and no trial is left mid-way; the rows."""
        self.warm_start()
        active: list[tuple[Trial, int]] = []
        for t in self.engine.unfinished():  # an interrupted search's trials go on
            if self._settled(t):  # (a layout asked, refused or measured, but not yet told)
                continue
            done = sorted(s for s in (t.reported or {}) if s in self.rungs)
            active.append((t, self.rungs.index(done[-1]) + 1 if done else 0))
        asks, cap = 0, MAX_ASKS_PER_TRIAL * self.study.tune.trials
        waiting: list[Trial] = []  # asked for a layout a trial of this batch measures
        while True:
            while (len(active) < self.study.tune.parallel and self.budget_left() and asks < cap
                   and self.layouts_measured + len(active) < self.study.tune.trials):
                asks += 1
                t = self.engine.ask()
                if self._settled(t):
                    continue
                if any(a.layout == t.layout for a, _ in active):
                    waiting.append(t)
                    continue
                active.append((t, 0))
            waiting = [t for t in waiting if not self._settled(t)]
            if not active:
                break
            outcomes = self.evaluate([(t.layout, self.rungs[r]) for t, r in active])
            active = [(t, r + 1) for t, r in active
                      if self._told(t, r, outcomes[(t.layout, self.rungs[r])])]
        return self.rows

    def _settled(self, t: Trial) -> bool:
        """Tell a trial that needs no run (refused, or its layout measured before) and record
        it; whether it was."""
        lay = t.layout.canonical(self.study.tune.gpus)
        if lay is None or lay not in self.feasible:
            reason = (self.refused.get(lay) if lay is not None else None) or (
                "the values contradict each other (interleaving needs virtual_stages > 1 and "
                "the other schedules 1) or the shape does not divide N")
            self.engine.tell(t, 0.0)
            self._row(t, t.layout, None, TrialState.REFUSED, reason)
            return True
        t.layout = lay
        if lay in self.measured:  # an earlier trial's result: nothing runs
            m = self.measured[lay]
            if m.state == TrialState.PRUNED:  # as the earlier trial: its rate at its rung
                self.engine.prune(t, m.steps, m.value)
            else:
                self.engine.tell(t, m.value)
            self._row(t, lay, None, TrialState.DUPLICATE, duplicate_reason(m), measured=m.value)
            return True
        return False

    def _told(self, t: Trial, r: int, o: Outcome) -> bool:
        """Record the outcome of trial ``t`` at rung ``r`` and tell the engine; whether the
        trial goes on to the next rung."""
        steps, last = self.rungs[r], r == len(self.rungs) - 1
        short = self._memory_short(o)
        if short:
            self.engine.tell(t, 0.0)
            self.measured[t.layout] = MeasuredLayout(TrialState.SHORT_OF_MEMORY, 0.0, short, steps,
                                               t.number)
            self._row(t, t.layout, o, TrialState.SHORT_OF_MEMORY, short, steps=steps)
            return False
        if o.state != RunState.OK:
            state = TrialState(o.state) if o.state in (
                RunState.OOM, RunState.TIMEOUT, RunState.CRASHED) else TrialState.INVALID
            self.engine.tell(t, 0.0)
            self.measured[t.layout] = MeasuredLayout(state, 0.0, o.reason, steps, t.number)
            self._row(t, t.layout, o, state, o.reason, steps=steps)
            return False
        if last:
            self.engine.tell(t, o.tokens_per_s_per_device)
            self.measured[t.layout] = MeasuredLayout(TrialState.COMPLETE, o.tokens_per_s_per_device, "",
                                               steps, t.number)
            self._row(t, t.layout, o, TrialState.COMPLETE, "", steps=steps)
            return False
        go_on = self.engine.report(t, steps, o.tokens_per_s_per_device)
        if not go_on:
            self.engine.prune(t)
            self.measured[t.layout] = MeasuredLayout(TrialState.PRUNED, o.tokens_per_s_per_device,
                                               f"pruned at {steps} steps", steps, t.number)
        self._row(t, t.layout, o, TrialState.PROMOTED if go_on else TrialState.PRUNED,
                  "" if go_on else f"not in the best 1/{self.study.tune.eta} at {steps} steps",
                  steps=steps)
        return go_on

    def _memory_short(self, o: Outcome) -> str:
        """Why an ok run leaves less memory free per device than ``tune.memory_left_gb`` of
        ``capacity_gb``; "" when it leaves enough, the study sets no condition, or the
        capacity or the peak is unknown."""
        need, cap = self.study.tune.memory_left_gb, self.capacity_gb
        if (need is None or cap is None or o.state != RunState.OK
                or not _finite(o.peak_memory_gb)):
            return ""
        left = cap - o.peak_memory_gb
        return ("" if left >= need else f"leaves {left:.3g} GB of {cap:.3g} GB free per "
                f"device (tune.memory_left_gb: {need:g})")

    def _row(self, t: Trial, lay: TrialLayout, o: Outcome | None, state: TrialState, reason: str,
             steps: int | None = None, measured: float = math.nan) -> None:
        n = self.study.tune.gpus
        row = {"trial": t.number, "layout": lay.name, **lay.params(),
               "dp": n // (lay.tp * lay.pp * lay.cp) if n % (lay.tp * lay.pp * lay.cp) == 0
               else math.nan,
               "steps": steps, "fidelity": steps / self.rungs[-1] if steps else math.nan,
               "state": state.value, "reason": reason,
               "predicted_tokens_per_s_per_device": self.predicted.get(lay, math.nan),
               "measured_tokens_per_s_per_device": (o.tokens_per_s_per_device if o
                                                    else measured),
               "peak_memory_gb": o.peak_memory_gb if o else math.nan,
               "wall_s": o.wall_s if o else 0.0,
               "device_hours": (o.wall_s * n / 3600 if o else 0.0),
               "warm_start": t.warm_start, "reused": o.reused if o else True,
               "point_id": o.point_id if o else ""}
        self.rows.append({k: row[k] for k in TRIAL_COLUMNS})
        self.write(self.rows)

    def resume(self, rows: list[dict]) -> None:
        """Go on from an earlier search's rows (trials.csv, as ``record.trials`` reads it: an
        empty cell is NaN): what they measured, and which trial measured it, is known."""
        self.rows = list(rows)
        for r in self.rows:
            state = TrialState(r["state"])
            if state in (TrialState.REFUSED, TrialState.DUPLICATE, TrialState.PROMOTED):
                continue
            value = r["measured_tokens_per_s_per_device"]
            told = state in (TrialState.COMPLETE, TrialState.PRUNED) and _finite(value)
            self.measured[TrialLayout.from_params(r)] = MeasuredLayout(
                state, float(value) if told else 0.0, _text(r["reason"]),
                int(r["steps"]) if _finite(r["steps"]) else 0,
                int(r["trial"]) if _finite(r["trial"]) else None)


def _text(x) -> str:
    """A text cell of a table read back: "" for an empty one (NaN), never ``"nan"``."""
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _finite(x) -> bool:
    """A finite number (numpy's scalars of a table read back included)."""
    return isinstance(x, numbers.Real) and math.isfinite(x)


def predictions(study: Study, points: dict) -> tuple[dict[TrialLayout, float], str]:
    """The step model's tokens/s per device of every accepted layout (``points``: layout ->
    planned point), priced through the one input path (``perf.inputs.model_inputs``), and a
    line saying what it priced on; no predictions (and why) when the model cannot price the
    study (a GPU study whose hardware is detected at run time)."""
    from scalestudy.perf import stepmodel
    from scalestudy.perf.inputs import model_inputs

    try:
        mi = model_inputs(study)
    except ValueError as e:
        return {}, f"no warm start: {e}"
    out = {}
    for lay, p in points.items():
        try:  # a layout the system cannot hold (tp over its node) is not priced
            out[lay] = stepmodel.predict_step_time(p, mi.hw, mi.measured).tokens_per_s / p.n
        except ValueError:
            continue
    return out, f"warm start priced on {mi.source} ({len(out)} of {len(points)} layouts)"


def best_study(study: Study, best: TrialLayout) -> dict:
    """The tuning study with its best layout as its one series (and no ``tune``): a study to
    run (``tune/best.yaml``)."""
    from dataclasses import replace

    doc = replace(study, series=(replace(best.series(study.tune), name=f"best-{best.name}"),),
                  tune=None).to_json()
    doc["description"] = f"the best layout {study.name}'s search measured (scalestudy tune)"
    return doc


def build(study: Study, tune_dir, evaluate: Evaluate, write=None) -> tuple[Search, str]:
    """The search of ``study``'s ``tune`` with its journal in ``tune_dir``, measuring through
    ``evaluate``, going on from ``tune_dir/trials.csv`` when it exists; and a line saying what
    the planner accepted and what the warm start was priced on. ``StudyError`` in one line
    when no layout of the space can run."""
    from pathlib import Path

    from scalestudy.config.study_yaml import StudyError
    from scalestudy.record.trials import TRIALS, read_trials
    from scalestudy.tune.space import axis_values, layouts, planned, rungs

    tune, tune_dir = study.tune, Path(tune_dir)
    points = planned(study, layouts(tune))
    accepted = {lay: p for lay, p in points.items() if p.feasible}
    if not accepted:
        lay, p = next(iter(points.items()))
        raise StudyError(f"tune.space: no layout of {tune.model} on {tune.gpus} devices can "
                         f"run ({lay.name}: {p.reason}); widen the space or change "
                         "global_batch")
    predicted, note = predictions(study, accepted)
    ladder = rungs(tune, study.train.steps)
    engine = SearchEngine(tune, axis_values(tune), tune_dir / "optuna.journal", ladder, study.name)
    from scalestudy.plan.constraints import capacity_bytes

    cap = capacity_bytes(study.platform, next(iter(accepted.values())).procs_per_node)
    search = Search(study, engine, ladder, set(accepted),
                    {lay: p.reason for lay, p in points.items() if not p.feasible},
                    predicted, evaluate, capacity_gb=cap / 1e9 if cap else None,
                    write=write or (lambda rows: None))
    before = read_trials(tune_dir / TRIALS.name)
    if before is not None:
        search.resume(before.to_dict("records"))
    return search, (f"{len(accepted)} of {len(points)} layouts accepted by the planner; rungs "
                    f"{ladder} steps; {note}")


def start(study: Study, study_file: str, results, profile: str | None, extra: list[str],
          trust_site: bool = False) -> tuple[list[dict], list]:
    """Search ``study``'s ``tune`` layout under ``results/<study>/tune/``, every trial run by
    Snakemake (``tune.measure.SnakemakeTrials``), going on from its journal and trials.csv
    when they exist; ``(rows, files written)``: trials.csv, best.yaml, the report
    (``report.tune``). ``StudyError`` in one line for a study without ``tune``, with secrets
    in its site or without a layout the planner accepts."""
    from pathlib import Path

    import pandas as pd

    from scalestudy import paths
    from scalestudy.config import sitepolicy
    from scalestudy.config.study_yaml import StudyError, dump_study
    from scalestudy.record.io import write_csv, write_text
    from scalestudy.record.trials import BEST_STUDY, TRIALS, TUNE_DIR, best_complete
    from scalestudy.report.tune import write_tune_report
    from scalestudy.tune.measure import SnakemakeTrials

    if study.tune is None:
        raise StudyError(f"{study_file}: tune: the study has no tune: section; add one "
                         "(model, gpus, global_batch, space; docs/tuning.md)")
    secret = [k for k in study.platform.site.env if sitepolicy.is_secret(k)]
    if secret:
        raise StudyError(f"{study_file}: platform.site.env.{secret[0]}: the trials' study files "
                         "are written under results/; give secrets through a profile's "
                         "site.yaml (--profile), not the study")
    study_dir = Path(results) / study.name
    tune_dir, trials_csv = study_dir / TUNE_DIR, study_dir / TRIALS
    evaluate = SnakemakeTrials(study, study_file, tune_dir,
                               profile or str(paths.profile("local")), extra, trust_site)
    try:
        search, note = build(study, tune_dir, evaluate, write=lambda rows: write_csv(
            pd.DataFrame(rows, columns=TRIAL_COLUMNS), trials_csv))
    except StudyError as e:
        raise StudyError(f"{study_file}: {e}") from None
    print(f"scalestudy tune: {note}")
    rows = search.run()
    written = [trials_csv]
    top = best_complete(pd.DataFrame(rows, columns=TRIAL_COLUMNS))
    if top is not None:
        best = TrialLayout.from_params(top.to_dict())
        written.append(write_text(study_dir / BEST_STUDY,
                                  f"# the best layout `scalestudy tune {study_file} --measure` "
                                  f"measured: {top['measured_tokens_per_s_per_device']:.4g} "
                                  "tokens/s per device\n"
                                  + dump_study(best_study(study, best), sort_keys=False)))
    # every accepted layout measured at full length: the exhaustive best is known
    ended = {r["layout"] for r in rows if r["state"] not in ("refused", "duplicate", "promoted",
                                                             "pruned")}
    exhaustive = (float(top["measured_tokens_per_s_per_device"])
                  if top is not None and {x.name for x in search.feasible} <= ended else None)
    written += write_tune_report(study_dir, exhaustive_best=exhaustive)
    return rows, written
