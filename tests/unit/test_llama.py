"""The Llama-style built-in model and its configuration: the model block's rules, RoPE as
Meta writes it, the grouped-query TP rule, the Llama 3 presets (scalestudy.config.presets,
workflow/config/llama3.yaml, tune), and that the new fields leave existing point ids alone.
(Parity across layouts: tests/parity_worker.py; FLOPs and parameters: tests/unit/test_flops.py;
memory: tests/unit/test_memory.py.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, swiglu_width
from scalestudy.config.checks import PointError
from scalestudy.config.study import load_study, validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.models import build_model, num_params
from scalestudy.models.llama import Llama, apply_rope, rope_table
from scalestudy.config.presets import LLAMA3, LLAMA3_PARAMS
from scalestudy.plan import constraints
from scalestudy.plan.planner import plan_points

ROOT = Path(__file__).resolve().parents[2]


def test_arch_sets_the_defaults():
    llama, gpt = Model(arch="llama"), Model()
    assert (llama.mlp, llama.bias, llama.n_kv_heads) == ("swiglu", False, 4)
    assert (gpt.mlp, gpt.bias) == ("gelu", True)
    assert Model(arch="llama", mlp="gelu", bias=True).mlp == "gelu"  # still settable


@pytest.mark.parametrize("kw, message", [
    (dict(arch="llama", kv_heads=3), "model.kv_heads: 3 does not divide heads 4"),
    (dict(kv_heads=2), "model.kv_heads: grouped-query attention needs arch llama"),
    (dict(rope_theta=500000.0), "model.rope_theta: only arch llama"),
    (dict(multiple_of=256), "model.multiple_of / ffn_dim_multiplier"),
    (dict(arch="llama", kv_heads=0), "model.kv_heads: 0 is not allowed"),
])
def test_model_block_rules(kw, message):
    with pytest.raises(PointError, match=message.replace("(", r"\(")):
        Model(**kw)


def test_model_block_errors_name_the_study_field():
    study = {"name": "t", "models": {"m": {"arch": "llama", "layers": 2, "hidden": 64,
                                           "heads": 4, "kv_heads": 3, "seq_len": 16,
                                           "vocab": 64}},
             "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1],
                         "micro_batch": 1}]}
    with pytest.raises(StudyError, match=r"^s\.yaml: models\.m\.kv_heads: 3 does not divide"):
        validate(study, "s.yaml")


def test_swiglu_width_rule():
    assert [swiglu_width(h, m, f) for h, m, f in ((4096, 1024, 1.3), (8192, 4096, 1.3),
                                                  (16384, 4096, 1.2), (4096, 256, None))] == \
        [14336, 28672, 53248, 11008]  # Llama 3 8B, 70B, 405B; Llama 2 7B
    assert Model(mlp="swiglu", hidden=64).ffn == 8 * ((int(8 * 64 / 3) + 7) // 8)  # as before


def test_the_new_model_fields_are_hashed():
    from scalestudy.config.identity import config_hash

    a = Point.for_layout(Model(arch="llama"))
    b = Point.for_layout(Model(arch="llama", kv_heads=2))
    assert config_hash(a) != config_hash(b) != config_hash(Point.for_layout(Model()))


def test_tp_must_divide_the_key_value_heads():
    m = Model(arch="llama", hidden=64, heads=8, kv_heads=2)
    assert constraints.violation(Point.for_layout(m, tp=2, device="cpu")) is None
    assert constraints.violation(Point.for_layout(m, tp=4, device="cpu")) == \
        "tp=4 does not divide kv_heads=2"


def test_rope_is_metas_complex_rotation():
    """The real-arithmetic rotation equals Meta's precompute_freqs_cis / apply_rotary_emb
    (meta-llama/llama3 llama/model.py): x viewed as complex pairs times polar(1, pos·freq)."""
    torch.manual_seed(0)
    b, s, h, d, theta = 2, 8, 3, 16, 500000.0
    x = torch.randn(b, s, h, d)
    freqs = 1.0 / (theta ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    freqs_cis = torch.polar(torch.ones(s, d // 2), torch.outer(torch.arange(s).float(), freqs))
    xc = torch.view_as_complex(x.float().reshape(b, s, h, -1, 2))
    meta = torch.view_as_real(xc * freqs_cis.view(1, s, 1, d // 2)).flatten(3)
    assert torch.allclose(apply_rope(x, rope_table(d, s, theta)), meta, atol=1e-6)


def test_llama_module():
    cfg = Model(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64)
    torch.manual_seed(0)
    model = build_model(cfg)
    assert isinstance(model, Llama) and num_params(model) == sum(
        p.numel() for p in model.parameters())
    assert "rope" not in model.state_dict()  # a constant: not a weight, not checkpointed
    assert tuple(model.layers["0"].attention.wk.weight.shape) == (16, 32)  # 2 kv heads x 8
    logits = model(torch.randint(0, 64, (2, 16)))
    assert logits.shape == (2, 16, 64)
    with torch.device("meta"):  # big models: built on meta, materialised, init_weights()
        meta = build_model(cfg)
    meta.to_empty(device="cpu")
    meta.init_weights()
    assert torch.equal(meta.rope, model.rope)


def test_llama3_presets_are_the_study_files_and_tunes():
    from scalestudy.plan.tune import known_models

    study = load_study(ROOT / "workflow/config/llama3.yaml")
    for name, preset in LLAMA3.items():
        assert study.models[name] == preset
        assert known_models()[name][0] == preset
        assert Model(**{**dataclasses.asdict(preset)}) == preset
    from scalestudy.config import flops

    assert {k: flops.param_count(m) for k, m in LLAMA3.items()} == LLAMA3_PARAMS
    points = plan_points(study)
    assert points and all(p.feasible and p.model.arch == "llama" for p in points)
    assert {p.model.name for p in points} == {"llama3-tiny"}  # the real shapes never run here


def test_docs_llama_example_plans(tmp_path):
    """The copy-paste example of the "Llama-style models" section (docs/studies.md) is a valid
    study."""
    import yaml

    text = (ROOT / "docs" / "studies.md").read_text().split("## Llama-style models", 1)[1]
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "readme.yaml"
    path.write_text(block)
    points = plan_points(load_study(path))
    assert len(points) == 5 and all(p.feasible and p.model.kv_heads == 2 for p in points)
    assert yaml.safe_load(block)["models"]["llama-small"]["arch"] == "llama"
