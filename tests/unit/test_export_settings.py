"""The study's export: section: declared like every setting (its parts in the generated schema
and reference), off unless a part is given, never part of a point or its id, a wrong value one
line naming the field; the shape every tracker receives, read from a finished study's tables
(parameters named as plan.tsv's columns, empty cells left out, failed points kept)."""

from __future__ import annotations

import json

import pytest

from scalestudy.config import settings
from scalestudy.config.export import EXPORT_SECTIONS, Export, WandbMode
from scalestudy.config.schema_gen import reference_text, generate_schema
from scalestudy.config.settings import Hash
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.config.studyspec import Study
from scalestudy.plan.planner import plan_points

STUDY = {"name": "s", "models": {"m": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32,
                                       "vocab": 64}},
         "platform": {"device": "cpu", "devices_per_node": 4},
         "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                     "micro_batch": 2}]}
ALL = {"mlflow": {"tracking_uri": "http://127.0.0.1:5000", "experiment": "e"},
       "wandb": {"project": "p", "entity": "t", "mode": "online", "dir": "/tmp/w"},
       "tensorboard": {"log_dir": "/tmp/tb"}}


def test_export_is_off_by_default_and_a_given_part_turns_its_tool_on():
    assert validate(STUDY).export == Export() and Export().tools == ()
    study = validate({**STUDY, "export": {"tensorboard": {}, "wandb": {}}})
    assert study.export.tools == ("wandb", "tensorboard")
    assert study.export.wandb.mode == WandbMode.OFFLINE and study.export.wandb.project is None
    full = validate({**STUDY, "export": ALL}).export
    assert full.mlflow.tracking_uri == "http://127.0.0.1:5000" and full.wandb.mode == "online"


def test_export_settings_never_change_a_point_or_its_id():
    base = plan_points(validate(STUDY))
    exported = plan_points(validate({**STUDY, "export": ALL}))
    assert [p.point_id for p in exported] == [p.point_id for p in base]
    assert [p.json_text() for p in exported] == [p.json_text() for p in base]
    for cls in EXPORT_SECTIONS.values():
        assert all(s.hash == Hash.NEVER for _, s in settings.declared(cls))


def test_the_section_round_trips_through_study_json():
    study = validate({**STUDY, "export": ALL})
    again = Study.from_validated(json.loads(json.dumps(study.to_json())))
    assert again.export == study.export
    assert Study.from_validated({**study.to_json(), "export": None}).export == Export()


@pytest.mark.parametrize("export, needle", [
    ({"wandb": {"mode": "onlin"}}, "export.wandb.mode: 'onlin' is not allowed; expected one "
                                   "of offline, online; did you mean 'online'?"),
    ({"mlflow": {"tracking_url": "x"}}, "export.mlflow: unknown key 'tracking_url'; did you "
                                        "mean 'tracking_uri'?"),
    ({"neptune": {}}, "export: unknown key 'neptune'"),
    ({"tensorboard": {"log_dir": 3}}, "export.tensorboard.log_dir"),
])
def test_a_wrong_export_value_is_one_line_naming_the_field(export, needle):
    with pytest.raises(StudyError) as e:
        validate({**STUDY, "export": export})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_schema_and_reference_come_from_the_declarations():
    props = generate_schema()["properties"]["export"]["properties"]
    for key, cls in EXPORT_SECTIONS.items():
        part = props[key.split(".")[1]]
        assert set(part["properties"]) == {f.name for f, _ in settings.declared(cls)}
        assert f"## `{key}:`" in reference_text()
    assert props["wandb"]["properties"]["mode"]["default"] == "offline"


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from synthetic_study import make_study

    from scalestudy.report.aggregate import aggregate_study

    folder = make_study(tmp_path_factory.mktemp("shape"))
    aggregate_study(folder)
    return folder


def test_the_shape_holds_every_point_failed_ones_with_their_state(synth):
    import pandas as pd

    from scalestudy.report.export.shape import NOT_PARAMS, read_study_shape

    shape = read_study_shape(synth)
    runs = pd.read_csv(synth / "runs.csv", dtype=str, keep_default_na=False)
    plan = pd.read_csv(synth / "plan.tsv", sep="\t", dtype=str, keep_default_na=False)
    assert [r.point_id for r in shape.runs] == list(runs["point_id"])
    by_id = {r.point_id: r for r in shape.runs}
    for row in runs.to_dict("records"):
        run = by_id[row["point_id"]]
        assert (run.state, run.reason, run.tags["state"]) == (row["status"], row["reason"],
                                                              row["status"])
        for k, v in row.items():  # a summary number is the table's; an empty cell is left out
            if k in ("step_time_median_s", "mfu", "peak_memory_gb"):
                assert (k in run.summary) == (v != "") and (v == "" or run.summary[k] == float(v))
    for p in plan.to_dict("records"):
        params = by_id[p["point_id"]].params
        assert params == {k: v for k, v in p.items() if k not in NOT_PARAMS and v != ""}
    states = {r.state for r in shape.runs}
    assert {"ok", "oom", "infeasible"} <= states
    ok = next(r for r in shape.runs if r.state == "ok")
    assert len(ok.steps) == 10 and all({"step", "step_time_s", "loss"} <= set(s) for s in ok.steps)
    eff = pd.read_csv(synth / "efficiency.csv")
    weak = eff[eff["series"] == "weak-dp"].dropna(subset=["efficiency"])
    assert dict(shape.curves["weak-dp"])[4]["efficiency"] == pytest.approx(
        float(weak.loc[weak["n"] == 4, "efficiency"].iloc[0]))


def test_a_run_digest_follows_its_content(synth):
    from scalestudy.report.export.shape import read_study_shape

    a, b = read_study_shape(synth), read_study_shape(synth)
    assert [r.digest for r in a.runs] == [r.digest for r in b.runs] and a.digest == b.digest
    run = a.runs[0]
    before = run.digest
    run.steps[-1]["loss"] += 1e-9
    assert run.digest != before
