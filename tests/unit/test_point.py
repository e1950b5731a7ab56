"""The typed point: ``point.json`` round trip, refusal of old or foreign files, and one
vocabulary shared by the schema and the point."""

import copy
import enum
import json
from pathlib import Path

import pytest

from scalestudy.config import vocab
from scalestudy.config.point import SCHEMA_VERSION, DPWrapper, Point
from scalestudy.config.checks import PointError
from scalestudy.config.identity import config_hash
from scalestudy.config.study import load_study, schema, validate
from scalestudy.plan.planner import plan_points


DEFAULT_STUDY = Path(__file__).resolve().parents[2] / "workflow" / "config" / "default.yaml"


@pytest.fixture(scope="module")
def default_points():
    return plan_points(load_study(DEFAULT_STUDY))


def infeasible_fractional() -> Point:
    """N=3 with tp=2: dp = 1.5 (and the batch derived from it), kept on the point."""
    study = validate({
        "name": "t",
        "models": {"m": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 128}},
        "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [2, 3], "tp": 2,
                    "micro_batch": 1}],
    })
    bad = [p for p in plan_points(study) if not p.feasible]
    assert len(bad) == 1
    return bad[0]


def through_json(p: Point, source: str = "point.json") -> Point:
    return Point.from_json(json.loads(json.dumps(p.to_json())), source)


def test_round_trip_of_planned_default_points(default_points):
    assert default_points and all(p.feasible for p in default_points)
    for p in default_points:
        back = through_json(p)
        assert back == p
        assert back.config_hash == config_hash(back) == p.config_hash
        assert back.point_id == p.point_id
        assert Point.from_json(json.loads(p.json_text())) == p
    # the typed fields come back typed, not as plain strings / lists
    back = through_json(default_points[0])
    assert isinstance(back.mode, vocab.ScalingMode)
    assert isinstance(back.parallel.dp_mode, vocab.DPMode)
    assert isinstance(back.train.precision, vocab.DType)
    assert isinstance(back.model.mlp, vocab.MLPKind)
    assert isinstance(back.references, tuple)


def test_round_trip_of_infeasible_point_with_fractional_dp():
    p = infeasible_fractional()
    assert p.dp == 1.5 and p.global_batch == 1.5 and not float(p.dp).is_integer()
    assert "N=3 is not divisible by tp*pp=2" in p.reason
    assert p.point_id.startswith("w_n3_dpx-tp2-pp1_mb1-ga1-gbx_")  # a fraction shows as x
    doc = json.loads(json.dumps(p.to_json()))
    assert doc["schema_version"] == SCHEMA_VERSION and doc["dp"] == 1.5
    assert doc["feasible"] is False
    back = Point.from_json(doc)
    assert back == p
    assert back.dp == 1.5 and back.reason == p.reason and back.feasible is False


@pytest.fixture
def doc(default_points):
    return json.loads(json.dumps(default_points[0].to_json()))


def refused(data, source="run/point.json") -> str:
    with pytest.raises(PointError) as e:
        Point.from_json(data, source)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{source}: "), msg
    return msg


def test_file_without_schema_version_is_refused(doc):
    del doc["schema_version"]
    assert "no schema_version" in refused(doc)


@pytest.mark.parametrize("version", [1, SCHEMA_VERSION + 1, "2"])
def test_file_of_another_version_is_refused(doc, version):
    doc["schema_version"] = version
    msg = refused(doc)
    assert f"schema_version {version!r}" in msg and f"version {SCHEMA_VERSION}" in msg, msg


def test_file_with_an_unknown_key_is_refused(doc):
    doc["gpus_per_node"] = 8
    assert "unknown key 'gpus_per_node'" in refused(doc)
    del doc["gpus_per_node"]
    doc["parallel"]["dp_modes"] = "ddp"
    msg = refused(doc)
    assert "parallel.dp_modes: unknown key" in msg, msg


def test_foreign_file_is_refused():
    assert "not a scalestudy point" in refused([1, 2, 3])
    assert "no schema_version" in refused({"n": 1, "dp": 1})


def _vocab_enums() -> dict[str, type]:
    return {name: obj for name, obj in vars(vocab).items()
            if isinstance(obj, type) and issubclass(obj, enum.Enum) and obj is not enum.StrEnum
            and obj.__module__ == vocab.__name__}


def test_schema_enums_are_the_vocabulary():
    """Every enumerated word of the schema comes from ``config.vocab``, and every vocabulary
    enum is in the schema: ``$defs.<x>.description`` names the enum it is filled from."""
    root = schema()
    enums = _vocab_enums()
    assert len(enums) >= 10
    filled = {}
    for name, d in root["$defs"].items():
        if "enum" not in d:
            continue
        source = d["description"].removeprefix("vocab.")
        filled[source] = name
        expected = (list(vocab.TRAIN_PRECISIONS) if source == "TRAIN_PRECISIONS"
                    else [m.value for m in enums[source]])
        assert d["enum"] == expected, (name, d["enum"], expected)
        assert d["enum"] and all(type(v) is str for v in d["enum"]), name
    assert set(enums) <= set(filled), set(enums) - set(filled)
    assert filled["TRAIN_PRECISIONS"] == "precision" and filled["DType"] == "dtype"
    assert root["$defs"]["precision"]["enum"] == ["fp32", "bf16"]  # not fp16: not trained
    # schema() hands out copies: editing one does not change the next
    root["$defs"]["dp_mode"]["enum"].append("zero9")
    assert schema()["$defs"]["dp_mode"]["enum"] == [m.value for m in vocab.DPMode]


def test_schema_has_no_enum_of_its_own():
    """Outside the vocabulary ``$defs`` no part of the schema lists allowed words itself."""
    root = schema()
    vocab_defs = {k for k, d in root["$defs"].items() if "enum" in d}
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if "enum" in node and where not in {f"$defs.{k}" for k in vocab_defs}:
                found.append(where)
            for k, v in node.items():
                walk(v, f"{where}.{k}" if where else k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(copy.deepcopy(root), "")
    assert found == []


@pytest.mark.parametrize("change, named", [
    ({"schema_version": None}, "no schema_version"),
    ({"schema_version": 1}, "schema_version 1"),
    ({"hidden": 64}, "unknown key 'hidden'"),
])
def test_point_json_file_is_refused_naming_the_file(tmp_path, doc, change, named):
    """A ``point.json`` as the runner and the trainer read it (``record.io.read_json``)."""
    from scalestudy.record.io import read_json

    for key, value in change.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    path = tmp_path / "run" / "point.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    msg = refused(read_json(path), str(path))
    assert named in msg, msg


@pytest.mark.parametrize("layout, mode, wrapper", [
    ({"dp": 1}, "ddp", "none"), ({"dp": 1, "tp": 2}, "fsdp", "none"),
    ({"dp": 2}, "ddp", "ddp"), ({"dp": 2}, "zero1", "ddp"),
    ({"dp": 2, "tp": 2}, "zero1", "ddp"), ({"dp": 2, "pp": 2}, "zero1", "ddp"),
    ({"dp": 2, "tp": 2}, "ddp", "replicate"), ({"dp": 2, "pp": 2}, "ddp", "replicate"),
    ({"dp": 2}, "fsdp", "fully_shard"), ({"dp": 2}, "fsdp_grad_op", "fully_shard"),
    ({"dp": 1, "cp": 2}, "ddp", "ddp"),
])
def test_the_data_parallel_wrapper_of_a_layout(layout, mode, wrapper):
    from scalestudy.config.parts import Model

    model = Model(name="t", layers=2, hidden=16, heads=2, seq_len=8, vocab=32)
    p = Point.for_layout(model, dp_mode=mode, **layout)
    assert p.dp_wrapper == DPWrapper(wrapper)
