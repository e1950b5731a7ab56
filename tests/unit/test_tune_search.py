"""The layout search's logic (``scalestudy.tune``): the space, the study's ``tune:`` section,
and the loop with the real Optuna engine over an evaluator that answers from a table (the
runs themselves are tested end to end in tests/integration/test_tune_measure.py)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.config.study import load_study, validate
from scalestudy.config.study_yaml import StudyError, parse
from scalestudy.config.vocab import Checkpointing, DPMode, PPSchedule
from scalestudy.record.states import RunState
from scalestudy.record.trials import TRIAL_COLUMNS, check_trials
from scalestudy.tune.measure import Outcome
from scalestudy.tune.search import build
from scalestudy.tune.space import TrialLayout, axis_values, layouts, rung_study, rungs

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "tune.yaml"


@pytest.fixture(scope="module")
def study():
    return load_study(EXAMPLE)


def lay(**kw) -> TrialLayout:
    base = dict(tp=1, pp=1, cp=1, micro_batch=1, pp_schedule=PPSchedule.ONE_F_ONE_B,
                virtual_stages=1, dp_mode=DPMode.DDP,
                activation_checkpointing=Checkpointing.NONE)
    return TrialLayout(**{**base, **kw})


# --- the space ----------------------------------------------------------------------------

def test_canonical_layouts_collapse_axes_that_do_not_apply():
    # no pipeline: the schedule does not apply; one data-parallel rank: the dp mode does not
    assert lay(pp_schedule=PPSchedule.GPIPE).canonical(4) == lay()
    assert lay(tp=4, dp_mode=DPMode.FSDP).canonical(4) == lay(tp=4)
    assert lay(tp=2, dp_mode=DPMode.FSDP).canonical(4).dp_mode == DPMode.FSDP
    # interleaving needs virtual stages, and only interleaving has them
    assert lay(pp=2, pp_schedule=PPSchedule.INTERLEAVED_1F1B).canonical(4) is None
    assert lay(pp=2, virtual_stages=2).canonical(4) is None
    assert lay(tp=3).canonical(4) is None  # does not divide N


def test_space_defaults_and_rungs(study):
    tune = replace(study.tune, space=replace(study.tune.space, tp=None, pp=None))
    axes = axis_values(tune)
    assert axes["tp"] == (1, 2, 4) and axes["pp"] == (1, 2, 4)
    lays = layouts(study.tune)
    assert len(lays) == len(set(lays)) == 45
    assert all(x.canonical(4) == x for x in lays)
    assert rungs(study.tune, 12) == [4, 12]
    assert rungs(replace(study.tune, min_steps=2, eta=2), 20) == [2, 4, 8, 16, 20]
    assert rungs(replace(study.tune, min_steps=None), 12) == [12]
    assert rungs(replace(study.tune, min_steps=12), 12) == [12]


def test_rung_study_is_a_study_of_the_layouts(study):
    from scalestudy.config.study_yaml import dump_study

    lays = layouts(study.tune)[:3]
    rung = rung_study(study, lays, 4)
    assert rung.name == "tune-tiny-s4" and rung.tune is None
    assert rung.train.steps == 4 and rung.train.warmup_steps == 2
    assert [s.name for s in rung.series] == [x.name for x in lays]
    again = validate(parse(dump_study(rung.to_json())), "rung")  # written, then loaded
    assert again.series == rung.series and again.train == rung.train


# --- the study's tune: section ------------------------------------------------------------

def _doc(text: str):
    return parse(EXAMPLE.read_text() + text)


def test_tune_section_is_checked_with_one_line(study):
    assert study.tune.gpus == 4 and study.tune.sampler == "tpe" and study.series == ()
    raw = parse(EXAMPLE.read_text())
    raw["tune"]["model"] = "tinyy"
    with pytest.raises(StudyError, match=r"tune\.model: 'tinyy' is not defined.*did you mean 'tiny'"):
        validate(raw, "s.yaml")
    raw = parse(EXAMPLE.read_text())
    raw["tune"]["sampler"] = "grid"
    with pytest.raises(StudyError, match="tune.sampler"):
        validate(raw, "s.yaml")
    raw = parse(EXAMPLE.read_text())
    del raw["tune"]
    with pytest.raises(StudyError, match="series: give at least one series"):
        validate(raw, "s.yaml")
    assert "tune" not in validate(parse((REPO / "workflow/config/default.yaml").read_text()),
                                  "d").to_json()


# --- the loop -----------------------------------------------------------------------------

def rate(x: TrialLayout, steps: int) -> float:
    """A deterministic tokens/s per device: less for model parallelism, more for larger
    micro-batches; the short rung reads 80% of the full one."""
    return (1000.0 / (x.tp * x.pp) + 50 * x.micro_batch) * (0.8 if steps < 12 else 1.0)


class Table:
    """An evaluator answering from :func:`rate`, logging what it was asked; out of memory for
    ``oom`` layouts; raises KeyboardInterrupt on call ``stop_at`` (an interrupted search)."""

    def __init__(self, oom=lambda x: False, stop_at: int | None = None):
        self.asked, self.calls, self.oom, self.stop_at = [], 0, oom, stop_at

    def __call__(self, batch):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        out = {}
        for x, steps in batch:
            self.asked.append((x, steps))
            if self.oom(x):
                out[(x, steps)] = Outcome(RunState.OOM, "CUDA out of memory", 0.0, math.nan,
                                          2.0, f"{x.name}-s{steps}", False)
            else:
                out[(x, steps)] = Outcome(RunState.OK, "", rate(x, steps), 0.1, 3.6,
                                          f"{x.name}-s{steps}", False)
        return out


def _search(study, tmp_path, evaluate, **tune):
    s = replace(study, tune=replace(study.tune, **tune))
    rows_file = tmp_path / "trials.csv"

    def write(rows):
        pd.DataFrame(rows, columns=TRIAL_COLUMNS).to_csv(rows_file, index=False)

    return build(s, tmp_path, evaluate, write=write)[0]


def test_search_warm_starts_measures_within_budget_and_halves(study, tmp_path):
    table = Table()
    search = _search(study, tmp_path, table, trials=6)
    rows = search.run()
    df = check_trials(pd.read_csv(tmp_path / "trials.csv"))  # the one reader accepts it
    assert len(df) == len(rows)
    # every accepted layout is priced, tp = 4 too (a CPU study's 4 processes per host)
    assert set(search.predicted) == search.feasible and any(x.tp == 4 for x in search.predicted)
    # the model's two best predicted layouts are measured first
    top2 = sorted(search.predicted, key=lambda x: -search.predicted[x])[:2]
    first = [r for r in rows if r["warm_start"]]
    assert [r["layout"] for r in first if r["steps"] == 4] == [x.name for x in top2]
    assert search.layouts_measured == 6
    # successive halving: a pruned trial never runs at full length, a complete one ran both
    pruned = {r["layout"] for r in rows if r["state"] == "pruned"}
    complete = {r["layout"] for r in rows if r["state"] == "complete"}
    assert pruned and complete and not pruned & complete
    full = {x.name for x, s in table.asked if s == 12}
    assert full == complete and not pruned & full
    assert all((x, 4) in table.asked for x, s in table.asked if s == 12)
    # no evaluation asked twice, and the device-hours are the runs' wall x N
    assert len(table.asked) == len(set(table.asked))
    assert search.device_hours == pytest.approx(len(table.asked) * 3.6 * 4 / 3600)


def test_failures_are_data_and_refusals_cost_nothing(study, tmp_path):
    table = Table(oom=lambda x: x.micro_batch == 4 and x.tp == 1)
    search = _search(study, tmp_path, table, trials=5, min_steps=None)
    # the planner refuses every tp=4 layout here: told zero, never run, not in the budget
    search.feasible = {x for x in search.feasible if x.tp != 4}
    rows = search.run()
    ooms = [r for r in rows if r["state"] == "oom"]
    assert ooms and all(r["measured_tokens_per_s_per_device"] == 0 for r in ooms)
    assert ooms[0]["reason"] == "CUDA out of memory"
    assert not any(x.tp == 4 for x, _ in table.asked)
    assert all(r["device_hours"] == 0 for r in rows if r["state"] in ("refused", "duplicate"))
    assert search.layouts_measured == 5
    best = max((r for r in rows if r["state"] == "complete"),
               key=lambda r: r["measured_tokens_per_s_per_device"])
    assert best["layout"] not in {r["layout"] for r in ooms}
    # the failed layouts were told zero throughput: in Optuna's record, not left out
    values = [t.value for t in search.engine.study.trials if t.state.name == "COMPLETE"]
    assert 0.0 in values


def test_a_search_goes_on_from_its_records(study, tmp_path):
    first = Table()
    _search(study, tmp_path, first, trials=3).run()
    again = Table()
    search = _search(study, tmp_path, again, trials=5)
    rows = search.run()
    assert search.layouts_measured == 5
    assert not set(first.asked) & set(again.asked)  # nothing measured twice
    assert {r["trial"] for r in rows} >= {0, 1, 2}


def test_an_interrupted_search_resumes_its_trials(study, tmp_path):
    stopped = Table(stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        _search(study, tmp_path, stopped, trials=4).run()
    again = Table()
    search = _search(study, tmp_path, again, trials=4)
    unfinished = search.engine.unfinished()
    assert unfinished  # the trial cut short is picked up, from the rung it reached
    rows = search.run()
    assert not search.engine.unfinished()
    assert search.layouts_measured == 4
    assert stopped.asked and not set(stopped.asked) & set(again.asked)  # nothing rerun
    assert {r["state"] for r in rows} <= {"promoted", "pruned", "complete", "duplicate",
                                          "refused"}


def test_trials_of_one_batch_never_measure_a_layout_twice(study, tmp_path):
    class Batches(Table):
        def __call__(self, batch):
            assert len(batch) == len(set(batch)), batch  # one rung study, distinct series
            return super().__call__(batch)

    space = replace(study.tune.space, tp=(1,), pp=(1,), micro_batch=(1, 2), dp_mode=("ddp",))
    table = Batches()
    search = _search(study, tmp_path, table, space=space, trials=2, parallel=4,
                     sampler="random", warm_start=0, min_steps=None)
    rows = search.run()
    assert sorted(x.name for x, _ in table.asked) == ["tp1-pp1-mb1-ddp-acnone",
                                                      "tp1-pp1-mb2-ddp-acnone"]
    assert search.layouts_measured == 2
    assert not search.engine.unfinished()  # every asked trial was told
    dup = [r for r in rows if r["state"] == "duplicate"]
    assert all(r["measured_tokens_per_s_per_device"] > 0 for r in dup)


def test_a_layout_that_leaves_too_little_memory_free_is_told_zero(study, tmp_path):
    table = Table()  # every run peaks at 0.1 GB per device
    search = _search(study, tmp_path, table, trials=3, min_steps=None, memory_left_gb=0.5)
    search.capacity_gb = 0.55  # 0.45 GB left: short of the 0.5 asked
    rows = search.run()
    short = [r for r in rows if r["state"] == "short_of_memory"]
    assert len(short) == 3 and not [r for r in rows if r["state"] == "complete"]
    assert "leaves 0.45 GB of 0.55 GB free" in short[0]["reason"]
    values = [t.value for t in search.engine.study.trials if t.state.name == "COMPLETE"]
    assert set(values) == {0.0}
    search2 = _search(study, tmp_path / "b", Table(), trials=2, min_steps=None,
                      memory_left_gb=0.4)
    search2.capacity_gb = 0.55  # 0.45 left: enough
    assert {r["state"] for r in search2.run()} <= {"complete", "duplicate", "refused"}


def test_a_duplicate_of_a_pruned_layout_is_pruned_at_the_same_rung(study, tmp_path):
    """Asked again for a layout successive halving stopped short, the engine hears what the
    earlier trial gave: pruned, with the same short-run rate at the same rung (not a complete
    trial at that rate)."""
    space = replace(study.tune.space, tp=(1, 2), pp=(1,), micro_batch=(1, 2), dp_mode=("ddp",))
    search = _search(study, tmp_path, Table(), space=space, trials=4, parallel=1,
                     sampler="random", warm_start=0, eta=2)
    rows = search.run()
    by_trial = {t.number: t for t in search.engine.study.trials}
    pruned = {r["layout"]: r for r in rows if r["state"] == "pruned"}
    dups = [r for r in rows if r["state"] == "duplicate" and r["layout"] in pruned]
    assert dups, "the search should have asked for a pruned layout again"
    for r in dups:
        t, first = by_trial[r["trial"]], pruned[r["layout"]]
        assert t.state.name == "PRUNED"
        assert t.intermediate_values == {first["steps"]: first["measured_tokens_per_s_per_device"]}
        assert r["measured_tokens_per_s_per_device"] == first["measured_tokens_per_s_per_device"]


def test_a_resumed_search_answers_a_repeat_from_its_source_trial(study, tmp_path):
    """A search cut after its first layout and resumed from its trials.csv (an empty reason
    reads back as NaN there): a trial asking for that layout again is answered from it, and
    its reason names the source trial and the value it gave, never ``nan``."""
    space = replace(study.tune.space, tp=(1,), pp=(1,), micro_batch=(1, 2), dp_mode=("ddp",))
    kw = dict(space=space, trials=2, parallel=1, sampler="random", warm_start=0, min_steps=None)
    with pytest.raises(KeyboardInterrupt):
        _search(study, tmp_path, Table(stop_at=2), **kw).run()
    search = _search(study, tmp_path, Table(), **kw)  # resumed from trials.csv
    (first,) = [r for r in search.rows if r["state"] == "complete"]
    t = search.engine.ask()
    t.layout = TrialLayout.from_params(first)
    assert search._settled(t)
    dup = search.rows[-1]
    value = float(first["measured_tokens_per_s_per_device"])
    assert dup["state"] == "duplicate" and dup["measured_tokens_per_s_per_device"] == value
    assert dup["reason"] == (f"measured by trial {int(first['trial'])}: complete, {value:.4g} "
                             "tokens/s per device"), dup["reason"]
