"""Settings declared once (config/settings.py, the fields of config/parts.py): the schema and
the settings reference are what the declarations generate; every declaration is sound; a
declared setting is checked, hashed, swept, planned, tuned and templated from its declaration
alone."""

from __future__ import annotations

import dataclasses
from enum import Enum

import pytest

from scalestudy.config import settings
from scalestudy.config.checks import PointError
from scalestudy.config.parts import (SERIES_SETTINGS, SETTING_SECTIONS, TUNED_SETTINGS, Parallel,
                                     Train, json_value, section_of)
from scalestudy.plan.docs_gen import generated_files
from scalestudy.config.settings import Hash, SeriesUse
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.parts import Model, Platform, Profile, Workload
from scalestudy.config.schema_gen import object_schema, sections
from scalestudy.config.site import Site
from scalestudy.config.studyspec import (Microbench, Predict, Report, Series, Study, Tune,
                                         TuneSpace)
from scalestudy.config.template import PLACEHOLDERS, command_argv
from scalestudy.plan.planner import PLAN_COLUMNS, plan_points, plan_rows, plan_table
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


def test_nothing_in_workflow_schemas_is_written_by_hand(repo):
    generated = set(generated_files(repo))
    assert [p for p in (repo / "workflow" / "schemas").iterdir() if p not in generated] == []


def test_every_section_of_the_study_is_declared():
    """The study's sections are found from Study's declared fields alone (what a new section
    needs), and every field of each is a declaration."""
    found = dict((cls, key) for key, cls in sections())
    assert {Study, Model, Series, Workload, Parallel, Train, Profile, Platform, Site, Tune,
            Microbench, Report, Predict} <= set(found), found
    assert found[Site] == "platform.site" and found[Model] == "models.<name>"
    for cls in found:
        undeclared = {f.name for f in dataclasses.fields(cls)} - {
            f.name for f, _ in settings.declared(cls)}
        assert not undeclared, (cls.__name__, undeclared)


def test_a_new_section_is_one_module_of_declarations():
    """A section's dataclass of declared settings and one declared field of the study make its
    schema (with defaults and ranges), its place among the sections and its typed value."""
    @dataclasses.dataclass(frozen=True)
    class Archive:
        format: str = settings.setting("csv", hash=Hash.NEVER, pattern="^[a-z]+$",
                                       doc="file format")
        digits: int = settings.setting(4, hash=Hash.NEVER, minimum=1, maximum=17,
                                       doc="significant digits")

    Extended = dataclasses.make_dataclass(
        "Extended", [("archive", Archive, settings.setting(factory=Archive, hash=Hash.NEVER,
                                                         doc="how tables are exported"))],
        bases=(Study,), frozen=True, kw_only=True)
    prop = object_schema(Extended)["properties"]["archive"]
    assert prop["default"] == {} and prop["additionalProperties"] is False
    assert prop["properties"]["digits"] == {"type": "integer", "minimum": 1, "maximum": 17,
                                            "default": 4, "description": "significant digits"}
    assert prop["properties"]["format"]["pattern"] == "^[a-z]+$"
    assert ("archive", Archive) in sections(Extended)
    doc = validate(STUDY).to_json()
    assert Extended.from_validated({**doc, "archive": {"digits": 6}}).archive == Archive(digits=6)


@pytest.mark.parametrize("key, cls", sections(), ids=[k or "study" for k, _ in sections()])
def test_every_declaration_is_sound(key, cls):
    """A one-line description, a default inside its own range, a swept or tuned setting that
    a series or search can take, a label only where a series sweeps it."""
    assert settings.declared(cls), cls
    for f, s in settings.declared(cls):
        assert s.doc and "\n" not in s.doc, f.name
        assert not (s.required and s.optional), f.name
        value = f.default
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert not settings.out_of_range(s, value), f.name
        if s.label is not None:
            assert s.series == SeriesUse.SWEEP, f.name
        if s.tune is not None:  # a tuned layout is a series giving its value
            assert settings.tuned(cls)[f.name] and s.series != SeriesUse.NONE, f.name
        if s.series == SeriesUse.SWEEP or s.tune is not None:  # a plan.tsv column shows it
            assert s.column, f.name


def test_a_declaration_states_its_hash_role():
    with pytest.raises(TypeError, match="hash"):
        settings.Setting(doc="x")


def test_a_series_names_a_setting_of_one_section_only():
    @dataclasses.dataclass(frozen=True)
    class Other:
        weight_decay: float = settings.setting(0.1, hash=Hash.ALWAYS, series=SeriesUse.SWEEP,
                                               doc="x")

    with pytest.raises(ValueError, match="'weight_decay' is declared by sections train and other"):
        settings.owners({**SETTING_SECTIONS, "other": Other}, series_use=True)


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
    tuned = {name for cls in SETTING_SECTIONS.values() for name in settings.tuned(cls)}
    assert tuned == set(TUNED_SETTINGS) and set(SERIES_SETTINGS) >= tuned
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


def _two_values(cls, name: str) -> list:
    """Two distinct values of a declared setting within its range (its tuning values first,
    an enum's first words, a number's default and the middle of its range above it)."""
    f, s = next((f, s) for f, s in settings.declared(cls) if f.name == name)
    kind = settings.value_type(cls, name)
    if s.tune is not None:
        return list(settings.tuned(cls)[name][:2])
    if isinstance(kind, type) and issubclass(kind, Enum):
        return list(kind)[:2]
    if kind is bool:
        return [False, True]
    lo = s.minimum if s.minimum is not None else (s.above + 1 if s.above is not None else 0)
    first = f.default if f.default is not None else lo
    hi = s.below if s.below is not None else s.maximum
    second = first * 2 + 1 if hi is None else (first + hi) / 2
    return [first, int(second) if kind is int else second]


def _cell(value) -> str:
    return "" if value is None else str(value.value if isinstance(value, Enum) else value)


SWEPT = {n for n in SERIES_SETTINGS if settings.meta(section_of(n), n).series == SeriesUse.SWEEP}


@pytest.mark.parametrize("name", sorted(SWEPT | set(TUNED_SETTINGS)))
def test_every_declared_sweep_is_planned_with_its_value_in_point_json_and_plan_tsv(name):
    """A setting a series sweeps (a list) or a search tunes (a series giving each value) plans
    into two points per N, with the value in the point's JSON and in its plan.tsv column."""
    cls, key = section_of(name), SERIES_SETTINGS[name]
    values = _two_values(cls, name)
    words = [json_value(v.value if isinstance(v, Enum) else v) for v in values]
    if settings.meta(cls, name).series == SeriesUse.SWEEP:
        doc = _with({name: words})
    else:
        doc = {**STUDY, "series": [{**STUDY["series"][0], "name": f"w{i}", name: w}
                                   for i, w in enumerate(words)]}
    points = plan_points(validate(doc))
    assert len(points) == 4 and len({p.point_id for p in points}) == 4
    table = plan_table(points).splitlines()
    column = table[0].split("\t").index(name)
    cells = {line.split("\t")[column] for line in table[1:]}
    assert cells == {_cell(v) for v in values}, (name, cells)
    for p in points:
        assert p.to_json()[key][name] in words
    assert {p.to_json()[key][name] for p in points if p.n == 1} == set(words)


def test_the_optimizer_takes_the_points_betas_and_weight_decay():
    import torch

    from scalestudy.config.parts import Model
    from scalestudy.config.point import Point
    from scalestudy.distributed.data_parallel import make_optimizer

    p = Point.for_layout(Model(), device="cpu", adam_beta1=0.8, adam_beta2=0.99,
                         weight_decay=0.1)
    opt = make_optimizer([torch.nn.Parameter(torch.ones(2))], p, None, torch.device("cpu"))
    assert opt.defaults["betas"] == (0.8, 0.99) and opt.defaults["weight_decay"] == 0.1
    assert Train().betas == (0.9, 0.95)
