"""Hostile and malformed study files: the loader's limits, JSON's integers and
patterns, finite numbers, the typed point's own checks, the size of a study after expansion,
and the memory check on CPU. The one-line messages of whole files are in
``tests/bad_studies/`` (``test_bad_input.py``); these are the unit checks behind them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import yaml

from scalestudy.config import limits
from scalestudy.config import study as study_mod
from scalestudy.config import study_yaml
from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Parallel, Platform, Train
from scalestudy.config.checks import PointError
from scalestudy.config.identity import identify
from scalestudy.config.study import load_study, schema, validate
from scalestudy.config.study_yaml import StudyError, parse, read_text
from scalestudy.plan import constraints
from scalestudy.plan.planner import grid_size, plan_points

GOOD = {
    "name": "s",
    "models": {"m": {"layers": 2, "hidden": 32, "heads": 2, "seq_len": 16, "vocab": 64}},
    "platform": {"device": "cpu", "devices_per_node": 4},
    "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2}],
}


def write(tmp_path, text: str | bytes, name="study.yaml") -> Path:
    p = tmp_path / name
    (p.write_bytes if isinstance(text, bytes) else p.write_text)(text)
    return p


def refused(path_or_raw) -> str:
    with pytest.raises(StudyError) as e:
        if isinstance(path_or_raw, (str, Path)):
            load_study(path_or_raw)
        else:
            validate(path_or_raw, "s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400, msg
    return msg


# --- the file -----------------------------------------------------------------------------------

def test_libyaml_is_used_when_available():
    if getattr(yaml, "__with_libyaml__", False):
        assert issubclass(study_yaml._UniqueKeyLoader, yaml.CSafeLoader)


def test_file_size_limit(tmp_path):
    big = write(tmp_path, "# x\n" * (limits.MAX_FILE_BYTES // 4 + 1))
    msg = refused(big)
    assert f"(file): {big.stat().st_size} bytes is too large (at most " \
        f"{limits.MAX_FILE_BYTES} bytes)" in msg


def test_not_a_regular_file(tmp_path):
    assert "(file): a folder" in refused(tmp_path)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would block for ever
    assert "(file): not a regular file" in refused(fifo)
    if Path("/dev/zero").exists():  # reading it would never end
        assert "not a regular file" in refused("/dev/zero")
    assert refused(tmp_path / "missing.yaml").endswith(
        "missing.yaml: cannot read the study file (No such file or directory); check the path")


def test_study_file_and_records_share_the_capped_reader(tmp_path):
    """config.files.read_capped: one core, each caller words the problem its own way."""
    from scalestudy.config.files import ReadProblem, read_capped
    from scalestudy.record.bounded_read import RecordError, read_bytes

    fifo = tmp_path / "status.json"
    os.mkfifo(fifo)
    big = write(tmp_path, b"x" * 11, "plan.tsv")
    assert read_capped(tmp_path / "none", 10) is None and read_capped(big, 11) == b"x" * 11
    for path, kind in ((tmp_path, "folder"), (fifo, "special"), (big, "size")):
        with pytest.raises(ReadProblem) as e:
            read_capped(path, 10)
        assert e.value.kind == kind
    with pytest.raises(RecordError, match="^status.json: not a regular file \\(a FIFO"):
        read_bytes(fifo)
    with pytest.raises(RecordError, match="^plan.tsv: 11 bytes, more than the 10 a sound"):
        read_bytes(big, 10)
    assert "(file): not a regular file (a YAML study file)" in refused(fifo)


@pytest.mark.parametrize("data, expected", [
    (b"\xff\xfen\x00a\x00m\x00e\x00", "(file): UTF-16 text (save the file as UTF-8 text)"),
    (b"name: a\x00b\n", "(file): a binary file (NUL byte at offset 7)"),
    (b"name: ok\ndescription: caf\xe9\n", "(file): byte 0xe9 at line 2 is not UTF-8"),
    (b"\x7fELF\x02\x01\x01" + bytes(range(1, 32)), "YAML syntax error"),
])
def test_binary_and_foreign_encodings(tmp_path, data, expected):
    assert expected in refused(write(tmp_path, data))


def test_limits_on_nesting_nodes_and_entries(tmp_path):
    deep = "name: s\nmodels: " + "[" * (limits.MAX_DEPTH + 1) + "]" * (limits.MAX_DEPTH + 1)
    assert "nested deeper than 32 levels" in refused(write(tmp_path, deep))
    many = "name: s\n" + "".join(f"d{i}: [" + ",".join(["1"] * 9000) + "]\n" for i in range(25))
    assert "(file): more than 200000 values" in refused(write(tmp_path, many))
    wide = "name: s\nmodels: {" + ",".join(f"k{i}: 1" for i in range(limits.MAX_ITEMS + 1)) + "}"
    assert "models: more than 10000 entries" in refused(write(tmp_path, wide))


def test_python_objects_get_the_same_limits():
    """validate() on objects built in Python (not from YAML): nesting that would overflow
    jsonschema's recursion, foreign types, non-text keys."""
    deep: list = []
    node = deep
    for _ in range(5000):
        node.append([])
        node = node[0]
    assert "nested deeper than 32 levels" in refused({**GOOD, "description": deep})
    assert "key 3 is a number" in refused({**GOOD, "models": {3: GOOD["models"]["m"]}})
    assert "is a bytes" in refused({**GOOD, "description": b"x"})


def test_duplicate_keys_still_refused_with_libyaml(tmp_path):
    msg = refused(write(tmp_path, "name: a\nname: b\n"))
    assert "duplicate key 'name' at line 2; keep one of them" in msg


def test_aliases_anchors_and_tags_are_refused_before_anything_is_built(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(study_yaml._UniqueKeyLoader, "construct_document",
                        lambda self, node: built.append(node))
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n"
        for i in range(8))
    assert "YAML anchors and aliases" in refused(write(tmp_path, bomb))
    assert "YAML tag 'tag:yaml.org,2002:python/name:os.system'" in refused(
        write(tmp_path, "name: !!python/name:os.system ''\n"))
    assert built == []


def test_a_large_study_parses(tmp_path):
    """A 5.8 MB study (comments and a long description around a real one) is read with
    libyaml (the pure-Python loader took over 60 s). No time bound here: see docs/security.md."""
    text = yaml.safe_dump(GOOD) + "description: '" + "x" * 2_000_000 + "'\n" \
        + "# padding\n" * 380_000
    path = write(tmp_path, text)
    assert 5.5e6 < path.stat().st_size < limits.MAX_FILE_BYTES
    assert load_study(path).name == "s"


def test_read_text_and_parse_are_usable_alone(tmp_path):
    assert parse(read_text(write(tmp_path, "a: [1, 2]\n")), "x") == {"a": [1, 2]}


# --- JSON's integers, patterns and finite numbers ---------------------------------------------

@pytest.mark.parametrize("where, value, expected", [
    (("repeats",), 2.0, "repeats: 2.0 is not allowed; expected an integer >= 1"),
    (("series", 0, "gpus"), [1.0], "series[0].gpus[0]: 1.0 is not allowed"),
    (("series", 0, "micro_batch"), 2.0, "series[0].micro_batch: 2.0 is not allowed"),
    (("train", "steps"), True, "train.steps: True is not allowed"),
    (("train", "lr"), math.nan, "train.lr: .nan is not allowed (a finite number)"),
    (("train", "lr"), math.inf, "train.lr: .inf is not allowed (a finite number)"),
    (("platform", "timeout_s"), -math.inf, "platform.timeout_s: -.inf is not allowed"),
    (("platform", "memory_per_device_gb"), math.nan, "platform.memory_per_device_gb: .nan"),
    (("name",), "abc\n", "name: 'abc\\n' is not allowed"),
    (("series", 0, "name"), "w\n", "series[0].name: 'w\\n' is not allowed"),
    (("platform", "site"), {"extra": "--x=1\n"}, "platform.site.extra: '--x=1\\n' is not"),
    (("platform", "site"), {"env": {"A\n": "1"}}, "platform.site.env: 'A\\n' is not allowed"),
    (("repeats",), 101, "repeats: 101 is not allowed; expected an integer >= 1 and <= 100"),
    (("models", "m", "seq_len"), 10**15, "expected an integer >= 1 and <= 4194304"),
    (("platform", "devices_per_node"), 10**12, "expected an integer >= 1 and <= 1024"),
    (("series", 0, "gpus"), [10**12], "expected an integer >= 1 and <= 1048576"),
    (("description",), "x" * 10**6, None),  # long text is fine
])
def test_schema_values(where, value, expected):
    import copy
    raw = copy.deepcopy(GOOD)
    raw.setdefault("train", {})
    node = raw
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    if expected is None:
        validate(raw, "s.yaml")
        return
    msg = refused(raw)
    assert expected in msg, msg
    assert len(msg) < 300


def test_every_schema_pattern_is_anchored_at_the_true_end():
    """Python's ``$`` matches before a final newline; the schema's patterns must not."""
    patterns = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("pattern"), str):
                patterns.append(node["pattern"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(schema())
    assert len(patterns) >= 8
    for pat in patterns:
        assert pat.startswith("^") and pat.endswith("$"), pat
        assert study_mod._compiled(pat).search("a") is not None or pat == "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
        assert study_mod._compiled(pat).search("a\n") is None, pat


def test_schema_maxima_are_the_limits():
    s = schema()
    props, defs = s["properties"], s["$defs"]
    plat = props["platform"]["properties"]
    assert props["repeats"]["maximum"] == limits.MAX_REPEATS
    assert props["retries"]["maximum"] == limits.MAX_RETRIES
    assert defs["series"]["properties"]["gpus"]["items"]["maximum"] == limits.MAX_DEVICES
    assert defs["series"]["properties"]["gpus"]["maxItems"] == limits.MAX_GPUS_LIST
    assert defs["model"]["properties"]["seq_len"]["maximum"] == limits.MAX_SEQ_LEN
    assert plat["devices_per_node"]["maximum"] == limits.MAX_DEVICES_PER_NODE
    assert plat["max_nodes"]["maximum"] == limits.MAX_NODES_PER_POINT
    assert plat["timeout_s"]["maximum"] == plat["collective_timeout_s"]["maximum"] \
        == limits.MAX_TIMEOUT_S
    assert props["train"]["properties"]["steps"]["maximum"] == limits.MAX_STEPS


# --- the typed point ----------------------------------------------------------------------------

@pytest.mark.parametrize("make, expected", [
    (lambda: Model(layers=2.0), "model.layers: 2.0 is not allowed (an integer)"),
    (lambda: Model(seq_len=10**15), "model.seq_len: 1000000000000000 is not allowed (an integer "
                                    "from 1 to 4194304)"),
    (lambda: Model(hidden=True), "model.hidden: True is not allowed (an integer)"),
    (lambda: Model(name="a/b"), "model.name: 'a/b' is not allowed"),
    (lambda: Train(lr=math.nan), "train.lr: nan is not allowed (a finite number)"),
    (lambda: Train(steps=0), "train.steps: 0 is not allowed (an integer from 2 to 1000000)"),
    (lambda: Platform(timeout_s=math.inf), "platform.timeout_s: inf is not allowed"),
    (lambda: Platform(timeout_s=0), "platform.timeout_s: 0 is not allowed (a number > 0 and "
                                    "<= 2592000)"),
    (lambda: Platform(devices_per_node=10**12), "platform.devices_per_node: 1000000000000"),
    (lambda: Platform(memory_per_device_gb=math.nan), "platform.memory_per_device_gb: nan"),
    (lambda: Parallel(virtual_stages=0), "parallel.virtual_stages: 0 is not allowed"),
    (lambda: Point.build(Model(), n=2.0), "point.n: 2.0 is not allowed (an integer)"),
    (lambda: Point.build(Model(), n=10**12), "point.n: 1000000000000 is not allowed"),
    (lambda: Point.build(Model(), n=2, series="a\nb"), "point.series: 'a\\nb' is not allowed"),
    (lambda: Point.build(Model(), n=2, study=".."), "point.study: '..' is not allowed"),
    (lambda: Point.build(Model(), n=2, repeat=1.0), "point.repeat: 1.0 is not allowed"),
    (lambda: Point.build(Model(), n=2, point_id="a\n"), "point.point_id: 'a\\n' is not allowed"),
    (lambda: Point.build(Model(), n=2, point_id="x" * 256), "point.point_id: 'xxx"),
    (lambda: Point(model=None, n=1, dp=1, tp=1, pp=1, micro_batch=1, grad_accum=1,
                   global_batch=1), "point.model: expected a Model"),
])
def test_typed_point_refuses(make, expected):
    with pytest.raises(PointError) as e:
        make()
    assert expected in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_point_json_with_whole_floats_or_nan_is_refused():
    p = identify(Point.build(Model(), n=2, micro_batch=2, series="w", study="s"))
    doc = p.to_json()
    for key, value in (("n", 2.0), ("micro_batch", 2.0), ("repeat", 0.0), ("retries", True)):
        with pytest.raises(PointError, match=f"point.{key}: "):
            Point.from_json({**doc, key: value})
    with pytest.raises(PointError, match="train.lr: nan"):
        Point.from_json({**doc, "train": {**doc["train"], "lr": math.nan}})
    assert Point.from_json(doc) == p  # the real thing still reads


def test_infeasible_points_keep_their_fractions():
    p = Point.build(Model(), n=3, tp=2)  # dp = 1.5: reported by the constraints, not refused
    assert p.dp == 1.5 and constraints.violation(p).startswith("N=3 is not divisible")


# --- the size of a study, ids and duplicates --------------------------------------------------

def _study(**series):
    import copy
    raw = copy.deepcopy(GOOD)
    raw["platform"] = {"device": "cpu", "devices_per_node": 1024, "max_nodes": 131072}
    raw["series"] = [{**raw["series"][0], **series}]
    return validate(raw, "s.yaml")


def test_grid_size_is_counted_without_expanding():
    s = _study(gpus=list(range(1, 201)), tp=list(range(1, 41)), pp=list(range(1, 41)),
               micro_batch=list(range(1, 41)))
    assert grid_size(s) == 200 * 40 * 40 * 40
    with pytest.raises(StudyError, match=r"s.yaml: series: the study expands to 12800000 runs "
                                         r"\(points x repeats\) \(at most 50000"):
        plan_points(s, "s.yaml")


def test_100000_device_counts_are_refused():
    raw = {**GOOD, "series": [{**GOOD["series"][0], "gpus": list(range(1, 100_001))}]}
    assert "series[0].gpus: has 100000 entries (at most 10000)" in refused(raw)


def test_a_large_grid_has_no_false_duplicates():
    """Ids and duplicate detection use the full SHA-256 of the config (a 32-bit hash gave
    false 'duplicates' on grids this size)."""
    s = _study(gpus=[8 * i for i in range(1, 4097)], tp=[1, 2])
    points = plan_points(s, "s.yaml")
    assert len(points) == 2 * 4096
    assert all(len(p.config_hash) == 64 for p in points)
    assert len({p.config_hash for p in points}) == len(points)
    assert len({p.point_id for p in points}) == len(points)
    assert len({p.point_id.rsplit("_", 2)[1] for p in points}) == len(points)  # 12-hex prefix


def test_expanded_names_are_checked_against_every_series():
    import copy
    raw = copy.deepcopy(GOOD)
    raw["series"] = [{**GOOD["series"][0], "name": "a", "gpus": [2], "tp": [1, 2]},
                     {**GOOD["series"][0], "name": "a-tp1", "gpus": [4]}]
    with pytest.raises(StudyError, match=r"series\[1\].name: 'a-tp1' names two series"):
        plan_points(validate(raw, "s.yaml"), "s.yaml")
    raw["series"][1]["name"] = "a-tp3"  # no clash: fine
    assert {p.series for p in plan_points(validate(raw, "s.yaml"))} == {"a-tp1", "a-tp2",
                                                                        "a-tp3"}


# --- memory on CPU ------------------------------------------------------------------------------

def test_cpu_capacity_is_the_hosts_memory_shared_by_its_processes():
    host = constraints.host_memory_bytes()
    assert host > 1e8
    base = limits.CPU_PROCESS_BASELINE_BYTES
    cpu = Platform(device="cpu")
    assert constraints.capacity_bytes(cpu, 1) == pytest.approx(host - base)
    assert constraints.capacity_bytes(cpu, 4) == pytest.approx(host / 4 - base)
    site = Platform(device="cpu", site={"mem_per_node_mb": 8192})
    assert constraints.capacity_bytes(site, 2) == pytest.approx(8192 * 2**20 / 2 - base)
    site = Platform(device="cpu", site={"mem_per_proc_mb": 1000, "mem_per_node_mb": 1})
    assert constraints.capacity_bytes(site, 8) == pytest.approx(1000 * 2**20 - base)
    assert constraints.capacity_bytes(Platform(device="cpu", memory_per_device_gb=2), 4) == 2e9
    assert constraints.capacity_bytes(Platform(device="auto")) is None  # unknown device


def test_cpu_point_bigger_than_the_host_is_skipped():
    import copy
    raw = copy.deepcopy(GOOD)
    raw["models"]["big"] = {"layers": 96, "hidden": 12288, "heads": 96, "seq_len": 2048,
                            "vocab": 50304}
    raw["series"].append({"name": "big", "mode": "weak", "model": "big", "gpus": [1],
                          "micro_batch": 1})
    points = plan_points(validate(raw, "s.yaml"))
    big = next(p for p in points if p.series == "big")
    assert not big.feasible and "does not fit in 90% of" in big.reason
    assert all(p.feasible for p in points if p.series == "w")


def test_replace_checks_what_it_changes():
    p = Point.build(Model(), n=2, series="w")
    assert p.replace(series="v", repeat=3).repeat == 3
    for change, expected in (({"n": 2.0}, "point.n: 2.0"), ({"point_id": "a\n"}, "point_id"),
                             ({"series": "a/b"}, "point.series"), ({"mode": "sideways"},
                                                                   "point.mode"),
                             ({"model": {}}, "point.model: expected a Model")):
        with pytest.raises(PointError, match=expected):
            p.replace(**change)
    with pytest.raises(TypeError, match="unknown field 'nodez'"):
        p.replace(nodez=1)
    assert p.replace(mode="weak").mode.__class__.__name__ == "ScalingMode"


def test_studies_written_from_python_have_no_aliases(tmp_path):
    shared = [1, 2]
    doc = {**GOOD, "series": [{**GOOD["series"][0], "name": n, "gpus": shared}
                              for n in ("a", "b")]}
    assert "&id001" in yaml.safe_dump(doc)  # PyYAML's default: refused by the loader
    from scalestudy.config.study_yaml import dump_study
    path = write(tmp_path, dump_study(doc))
    assert "&" not in path.read_text()
    assert [s.gpus for s in load_study(path).series] == [(1, 2), (1, 2)]


def test_unique_items_keeps_json_equality():
    """uniqueItems is checked by hashing (jsonschema compares mappings pairwise: 10,000 of
    them took minutes); 1 and 1.0 are equal in JSON, true and 1 are not."""
    def gpus(values):
        return {**GOOD, "series": [{**GOOD["series"][0], "gpus": values}]}
    assert "series[0].gpus: has duplicate entries" in refused(gpus([1, 2, 1]))
    assert "has duplicate entries" in refused({**GOOD, "references": ["megatron_sc21"] * 2})
    from scalestudy.config.study import _identity
    assert _identity(1) == _identity(1.0) and _identity(True) != _identity(1)
    assert _identity({"a": [1, {"b": 2}]}) == _identity({"a": [1.0, {"b": 2}]})
    assert _identity([1, 2]) != _identity([2, 1])
    raw = {**GOOD, "references": [{"a": i} for i in range(limits.MAX_ITEMS)]}
    assert "references[0]: {'a': 0} is not allowed" in refused(raw)


def test_checkpointed_layers_are_counted_not_enumerated():
    from scalestudy.perf import memory

    def brute(layers, pp, stage, virtual):
        k = layers // (pp * virtual)
        return sum(1 for c in range(virtual)
                   for i in range((c * pp + stage) * k, (c * pp + stage + 1) * k) if i % 2 == 0)
    for layers in (1, 2, 3, 6, 8, 12, 30, 48):
        for pp in (1, 2, 3, 4):
            for virtual in (1, 2, 3):
                for stage in range(pp):
                    assert memory.checkpointed_layers(layers, pp, stage, virtual, "selective") \
                        == brute(layers, pp, stage, virtual), (layers, pp, stage, virtual)
    assert memory.checkpointed_layers(2**52, 1, 0, 1, "selective") == 2**51  # instant


def test_pipeline_stages_of_a_study_are_bounded():
    s = _study(gpus=[2**20], pp=2**20, micro_batch=1)
    with pytest.raises(StudyError, match=r"series\[0\].pp: the study's points have more than "
                                         r"1000000 pipeline stages in all"):
        plan_points(s, "s.yaml")
