"""Study files: schema validation with one-line messages naming the field and the fix."""

import pytest
import yaml

from scalestudy.config.study import load_study
from scalestudy.config.study_yaml import StudyError

GOOD = """
name: s1
models:
  m: {layers: 2, hidden: 64, heads: 4, seq_len: 32, vocab: 128}
series:
  - {name: w, mode: weak, model: m, gpus: [1, 2], micro_batch: 2}
"""


def write(tmp_path, text):
    p = tmp_path / "study.yaml"
    p.write_text(text)
    return p


def test_shipped_studies_validate(repo):
    for path in sorted((repo / "workflow/config").glob("*.yaml")):
        study = load_study(path)
        assert study.series, path


def test_defaults_are_filled(tmp_path):
    s = load_study(write(tmp_path, GOOD))
    assert s.repeats == 1 and s.train.steps == 12
    assert s.parallel.dp_mode == "ddp" and s.platform.device == "auto"
    assert s.models["m"].mlp == "gelu" and s.series[0].tp == 1


def mutate(path_value):
    raw = yaml.safe_load(GOOD)
    *keys, last = path_value[0]
    node = raw
    for k in keys:
        node = node[k]
    if path_value[1] is KeyError:
        del node[last]
    else:
        node[last] = path_value[1]
    return yaml.safe_dump(raw)


@pytest.mark.parametrize("change, expected", [
    ((["series", 0, "mode"], "weka"),
     "series[0].mode: 'weka' is not allowed; expected one of weak, strong; did you mean 'weak'?"),
    ((["series", 0, "dp_mode"], ["ddp", "fsdq"]),
     "series[0].dp_mode[1]: 'fsdq' is not allowed; expected one of ddp, zero1, fsdp_grad_op, fsdp; "
     "did you mean 'fsdp'?"),
    ((["series", 0, "gpus"], "4"), "series[0].gpus: '4' is not allowed; expected a list of an integer >= 1"),
    ((["series", 0, "gpu"], [1]), "series[0]: unknown key 'gpu'; did you mean 'gpus'? allowed keys:"),
    ((["series", 0, "zzz"], [1]), "series[0]: unknown key 'zzz'; allowed keys:"),  # nothing near
    ((["series", 0, "gpus"], []), "series[0].gpus: must not be empty"),
    ((["models", "m", "hidden"], -64), "models.m.hidden: -64 is not allowed; expected an integer >= 1"),
    ((["name"], "a b; rm -rf /"), "name: 'a b; rm -rf /' is not allowed; expected letters, digits"),
    ((["series", 0, "name"], "../x"), "series[0].name: '../x' is not allowed"),
    ((["models", "m", "layers"], KeyError), "models.m: 'layers' is a required property; add it"),
    ((["series", 0, "model"], "nope"), "series[0].model: 'nope' is not defined; use one of m"),
    ((["series", 0, "model"], "mm"), "series[0].model: 'mm' is not defined; use one of m; "
                                     "did you mean 'm'?"),
    ((["series", 0, "tp"], [1, 1]), "series[0].tp: 'has duplicate entries'"[:14]),
])
def test_bad_fields_name_the_field(tmp_path, change, expected):
    with pytest.raises(StudyError) as e:
        load_study(write(tmp_path, mutate(change)))
    msg = str(e.value)
    assert "\n" not in msg
    assert expected in msg, msg


def test_yaml_syntax_error_names_the_line(tmp_path):
    with pytest.raises(StudyError, match=r"YAML syntax error at line \d+"):
        load_study(write(tmp_path, GOOD + "  - {name: x, mode: [\n"))


def test_strong_needs_global_batch(tmp_path):
    text = GOOD.replace("mode: weak", "mode: strong")
    with pytest.raises(StudyError, match=r"series\[0\].global_batch: required for mode strong"):
        load_study(write(tmp_path, text))


def test_heads_must_divide_hidden(tmp_path):
    with pytest.raises(StudyError, match="models.m.heads: 5 does not divide hidden 64"):
        load_study(write(tmp_path, GOOD.replace("heads: 4", "heads: 5")))


def test_unknown_hardware(tmp_path):
    with pytest.raises(StudyError, match="platform.hardware: unknown device 'TPUv9'"):
        load_study(write(tmp_path, GOOD + "platform: {hardware: TPUv9}\n"))


def test_not_a_mapping(tmp_path):
    with pytest.raises(StudyError, match="must hold a mapping"):
        load_study(write(tmp_path, "- a\n- b\n"))
