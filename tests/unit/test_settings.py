"""Settings declared once (config/settings.py, the fields of config/parts.py): the schema and
the settings reference are what the declarations generate; every declaration is sound; a
declared setting is checked, hashed, swept, planned, tuned and templated from its declaration
alone."""

from __future__ import annotations

import dataclasses

import pytest

from scalestudy.config import settings
from scalestudy.config.checks import PointError
from scalestudy.config.parts import SETTING_SECTIONS, Parallel, Train
from scalestudy.config.schema_gen import generated_files
from scalestudy.config.settings import Hash, SeriesUse
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.studyspec import TuneSpace
from scalestudy.config.template import PLACEHOLDERS, command_argv
from scalestudy.plan.planner import PLAN_COLUMNS, plan_points, plan_rows
from scalestudy.tune.space import TrialLayout

SHAPE = ("tp", "pp", "cp", "micro_batch")
STUDY = {"name": "s", "models": {"m": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32,
                                       "vocab": 64}},
         "platform": {"device": "cpu", "devices_per_node": 4},
         "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                     "micro_batch": 2}]}


def _with(series: dict | None = None, **top) -> dict:
    return {**STUDY, **top, "series": [{**STUDY["series"][0], **(series or {})}]}


def test_the_checked_in_schema_and_reference_are_the_generated_ones(repo):
    for path, text in generated_files(repo).items():
        assert path.read_text() == text, f"{path} is not the generated one: run `make schema`"


@pytest.mark.parametrize("cls", list(SETTING_SECTIONS.values()), ids=list(SETTING_SECTIONS))
def test_every_declaration_is_sound(cls):
    """A one-line description, a default inside its own range, a swept or tuned setting that
    a series or search can take, a label only where a series sweeps it."""
    assert settings.declared(cls), cls
    defaults = cls()  # the defaults pass the field checks
    for f, s in settings.declared(cls):
        assert s.doc and "\n" not in s.doc, f.name
        value = getattr(defaults, f.name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert not settings.out_of_range(s, value), f.name
        if s.label is not None:
            assert s.series == SeriesUse.SWEEP, f.name
        if s.tune is not None:
            assert settings.tuned(cls)[f.name], f.name


def test_a_range_comes_from_the_declaration_with_one_line():
    with pytest.raises(PointError, match=r"^train\.steps: 1 is not allowed \(an integer from 2 "
                                         r"to 1000000\)$"):
        Train(steps=1)
    with pytest.raises(PointError, match=r"^parallel\.ddp_bucket_cap_mb: 0 is not allowed \(a "
                                         r"number > 0 and <= 4096\)$"):
        Parallel(ddp_bucket_cap_mb=0)
    with pytest.raises(StudyError, match="parallel.ddp_bucket_cap_mb"):
        validate(_with(parallel={"ddp_bucket_cap_mb": -1}))


def test_the_tune_axes_are_the_declared_ones():
    """TuneSpace and TrialLayout carry one field per tuned setting besides the shape."""
    tuned = set(settings.tuned(Parallel))
    assert {f.name for f in dataclasses.fields(TuneSpace)} - set(SHAPE) == tuned
    assert {f.name for f in dataclasses.fields(TrialLayout)} - set(SHAPE) == tuned


def test_a_setting_left_at_its_default_keeps_the_point_id_and_set_it_is_another_point():
    base = plan_points(validate(STUDY))
    same = plan_points(validate(_with(parallel={"ddp_bucket_cap_mb": None})))
    other = plan_points(validate(_with(parallel={"ddp_bucket_cap_mb": 10})))
    assert settings.meta(Parallel, "ddp_bucket_cap_mb").hash == Hash.WHEN_SET
    assert [p.point_id for p in same] == [p.point_id for p in base]
    assert not {p.point_id for p in other} & {p.point_id for p in base}


def test_a_series_sweeps_a_declared_setting_into_the_plan_and_the_template():
    points = plan_points(validate(_with({"ddp_bucket_cap_mb": [10, 50.5]})))
    assert sorted({p.series for p in points}) == ["w-bucket10", "w-bucket50.5"]
    assert "ddp_bucket_cap_mb" in PLAN_COLUMNS and "ddp_bucket_cap_mb" in PLACEHOLDERS
    rows = {(r["series"], r["n"]): r["ddp_bucket_cap_mb"] for r in plan_rows(points)}
    assert rows[("w-bucket10", 2)] == 10 and rows[("w-bucket50.5", 1)] == 50.5
    command = {"command": ["{python}", "t.py", "--bucket={ddp_bucket_cap_mb}"],
               "metrics": "steps_jsonl"}
    (p, *_) = plan_points(validate(_with({"ddp_bucket_cap_mb": 25, "workload": command})))
    assert command_argv(p, "/r", "py")[-1] == "--bucket=25"


def test_a_setting_its_wrapper_does_not_have_is_refused_by_its_constraint():
    points = plan_points(validate(_with({"ddp_bucket_cap_mb": 10, "dp_mode": ["ddp", "fsdp"]})))
    verdict = {(p.series, p.n): (p.feasible, p.reason) for p in points}
    assert verdict[("w-ddp", 2)][0]
    assert verdict[("w-fsdp", 1)][0]  # one rank: no wrapper, nothing to refuse
    ok, reason = verdict[("w-fsdp", 2)]
    assert not ok and "ddp_bucket_cap_mb" in reason and "fully_shard" in reason
