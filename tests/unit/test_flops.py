"""FLOPs and parameter formulas vs FlopCounterMode on the real model and vs SC21 Table 1."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from scalestudy.config.parts import Model
from scalestudy.config.vocab import FlopsConvention
from scalestudy.models import build_model, num_params
from scalestudy.config.presets import LLAMA3
from scalestudy.config import flops

# Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
# Megatron-LM" (SC21), Table 1 (V = 51,200, s = 2048): (params in billions, layers, hidden).
SC21_TABLE1 = [
    (1.7, 24, 2304), (3.6, 30, 3072), (7.5, 36, 4096), (18.4, 40, 6144), (39.1, 48, 8192),
    (76.1, 60, 10240), (145.6, 80, 12288), (310.1, 96, 16384), (529.6, 105, 20480),
    (1008.0, 128, 25600),
]

CONFIGS = [
    dict(),  # GELU 4h, biases, untied
    dict(tied_embeddings=True),
    dict(mlp="swiglu"),
    dict(mlp="swiglu", ffn_hidden=96, bias=False, tied_embeddings=True),
    # Llama-style: RMSNorm, RoPE, SwiGLU, no biases, untied; grouped-query attention
    dict(arch="llama"),
    dict(arch="llama", kv_heads=2),
    dict(arch="llama", kv_heads=1, tied_embeddings=True, bias=True, multiple_of=32,
         ffn_dim_multiplier=1.3),
    dict(arch="llama", kv_heads=2, mlp="gelu"),
]


def counted_flops(cfg: Model, rows: int, wrap_layers: str | bool = False) -> int:
    """Forward + backward FLOPs as FlopCounterMode counts them, on the meta device, under the
    math SDPA backend (the default CPU flash kernel is not counted: FlopCounterMode has no formula for it)."""
    with torch.device("meta"):
        model = build_model(cfg)
    if wrap_layers:  # activation checkpointing as scalestudy.distributed.engine applies it
        for key, layer in model.layers.items():
            if wrap_layers == "selective" and int(key) % 2:
                continue  # selective: layers 0, 2, 4, ... only
            layer.forward = (lambda f: lambda *a: checkpoint(f, *a, use_reentrant=False))(layer.forward)
    x = torch.randint(0, cfg.vocab, (rows, cfg.seq_len), device="meta")
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(x).float().sum().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "gelu")
def test_model_flops_match_flop_counter(kw):
    # Tolerance: exact (rel 1e-12). FlopCounterMode counts only matmul-family ops (mm, addmm
    # without the bias add, bmm, SDPA) and so does the formula; both count the full s x s
    # attention. Elementwise ops are counted by neither.
    cfg = Model(vocab=128, seq_len=32, layers=2, hidden=64, heads=4, **kw)
    counted = counted_flops(cfg, rows=3)
    assert flops.model_flops_per_step(cfg, 3, "megatron") == pytest.approx(counted, rel=1e-12)
    palm = flops.model_flops_per_step(cfg, 3, "palm")
    head = 6 * cfg.hidden * cfg.vocab * 3 * cfg.seq_len  # the tied head PaLM leaves out
    assert palm == pytest.approx(counted - (head if cfg.tied_embeddings else 0), rel=1e-12)


def test_full_recompute_matches_flop_counter():
    cfg = Model(vocab=128, seq_len=32, layers=2, hidden=64, heads=4)
    formula = flops.hardware_flops_per_step(cfg, 2, "megatron", "full")
    # Recomputing the whole layer forward (Megatron's convention): exact.
    with set_checkpoint_early_stop(False):
        assert formula == pytest.approx(counted_flops(cfg, rows=2, wrap_layers=True), rel=1e-12)
    # PyTorch's default non-reentrant checkpoint stops recomputing once every saved tensor is
    # back, so it skips each layer's last matmul (the MLP down projection, 2 h f s per row):
    # real hardware FLOPs are that much below the convention.
    skipped = 2 * cfg.layers * 2 * cfg.hidden * cfg.ffn * cfg.seq_len
    assert formula - skipped == pytest.approx(counted_flops(cfg, rows=2, wrap_layers=True), rel=1e-12)


def test_selective_recompute_matches_flop_counter():
    # scalestudy.distributed.engine's "selective": layers 0, 2, ... re-run (3 layers -> 2 recomputed)
    cfg = Model(vocab=128, seq_len=32, layers=3, hidden=64, heads=4, mlp="swiglu")
    formula = flops.hardware_flops_per_step(cfg, 2, "megatron", "selective")
    with set_checkpoint_early_stop(False):
        assert formula == pytest.approx(counted_flops(cfg, rows=2, wrap_layers="selective"), rel=1e-12)
    extra = formula - flops.model_flops_per_step(cfg, 2, "megatron")
    assert extra == pytest.approx(2 / 3 * (flops.hardware_flops_per_step(cfg, 2, "megatron", "full")
                                           - flops.model_flops_per_step(cfg, 2, "megatron")), rel=1e-12)


def test_reduces_to_megatron_eq3():
    cfg = Model(vocab=51200, seq_len=2048, layers=24, hidden=2304, heads=24)
    b = 512
    eq3 = flops.megatron_flops_per_step(b, 2048, 24, 2304, 51200)
    eq3_rc = flops.megatron_flops_per_step(b, 2048, 24, 2304, 51200, recompute=True)
    assert flops.model_flops_per_step(cfg, b, "megatron") == pytest.approx(eq3, rel=1e-12)
    assert flops.hardware_flops_per_step(cfg, b, "megatron", "full") == pytest.approx(eq3_rc, rel=1e-12)
    assert flops.hardware_flops_per_step(cfg, b, "megatron", "none") == pytest.approx(eq3, rel=1e-12)
    sel = flops.hardware_flops_per_step(cfg, b, "megatron", "selective_attention") - eq3
    assert sel == pytest.approx(b * 24 * 4 * 2048**2 * 2304, rel=1e-12)
    # untied head: PaLM's 6N + 12 l H Q s equals Eq. 3
    assert flops.model_flops_per_step(cfg, b, "palm") == pytest.approx(eq3, rel=1e-12)


def test_palm_formula_by_hand():
    assert flops.palm_flops_per_token(1e9, 10, 8, 64, 128) == 6e9 + 12 * 10 * 8 * 64 * 128


@pytest.mark.parametrize("params_b,layers,hidden", SC21_TABLE1)
def test_param_formula_reproduces_sc21_table1(params_b, layers, hidden):
    # The table rounds to 0.1 B parameters.
    assert round(flops.megatron_params(layers, hidden, 51200, 2048) / 1e9, 1) == params_b


@pytest.mark.parametrize("kw", CONFIGS + [dict(bias=False)])
def test_gpt_params_counts_the_model(kw):
    cfg = Model(vocab=96, seq_len=16, layers=3, hidden=32, heads=4, **kw)
    with torch.device("meta"):
        assert flops.param_count(cfg) == num_params(build_model(cfg))


def test_model_is_eq2_plus_final_norm():
    cfg = Model(vocab=96, seq_len=16, layers=3, hidden=32, heads=4, tied_embeddings=True)
    assert flops.param_count(cfg) == pytest.approx(flops.megatron_params(3, 32, 96, 16) + 2 * 32, abs=1e-6)


def test_unknown_convention_names_the_field():
    cfg = Model()
    with pytest.raises(ValueError, match="flops_convention='kaplan'.*megatron, palm"):
        flops.model_flops_per_step(cfg, 1, "kaplan")
    with pytest.raises(ValueError, match="activation_checkpointing='some'.*none, full, selective"):
        flops.hardware_flops_per_step(cfg, 1, "megatron", "some")


def test_flops_table_has_every_convention():
    cfg = Model()
    table = flops.flops_table(cfg, 4, "full")
    assert set(table["model"]) == set(FlopsConvention) == {"megatron", "palm"}
    assert table["hardware"]["megatron"] > table["model"]["megatron"]


def test_gqa_shrinks_only_the_key_value_projections():
    """Per token and layer (forward + backward) GQA saves 12·h·(h - kv_dim) FLOPs: the key
    and value projections; the attention matmuls run for every query head as before."""
    mha = Model(arch="llama", vocab=128, seq_len=32, layers=2, hidden=64, heads=4)
    gqa = Model(arch="llama", vocab=128, seq_len=32, layers=2, hidden=64, heads=4, kv_heads=1)
    saved = flops.model_flops_per_step(mha, 1) - flops.model_flops_per_step(gqa, 1)
    assert saved == 12 * 64 * (64 - 16) * 2 * 32
    assert saved == counted_flops(mha, 1) - counted_flops(gqa, 1)


def test_llama_full_recompute_matches_flop_counter():
    cfg = Model(arch="llama", vocab=128, seq_len=32, layers=2, hidden=64, heads=4, kv_heads=2)
    with set_checkpoint_early_stop(False):
        assert flops.hardware_flops_per_step(cfg, 2, "megatron", "full") == pytest.approx(
            counted_flops(cfg, rows=2, wrap_layers=True), rel=1e-12)


# Published sizes: Llama 3 8B "8.03B params" and Llama 3 70B "70.6B params" (Hugging Face's
# model-size figure on Meta-Llama-3 derivatives, e.g. huggingface.co/UmmeHani2000/llama3.1_8B
# and huggingface.co/ProbablyFaiz/Meta-Llama-3.3-70B-Instruct-FP8; Meta's model cards say only
# "8B" / "70B"); the exact 8,030,261,248 of Llama-3-8B also in thamada/modelQuery's README.
# Shapes: Meta's models/sku_list.py (meta-llama/llama-models), scalestudy.config.presets.
@pytest.mark.parametrize("name, published, digits", [
    ("llama3-8b", 8.03e9, 2), ("llama3-70b", 70.6e9, 1)])
def test_llama3_parameter_counts_match_the_published_sizes(name, published, digits):
    cfg = LLAMA3[name]
    with torch.device("meta"):
        n = num_params(build_model(cfg))  # the real module, shapes only
    assert n == flops.param_count(cfg)
    assert round(n / 1e9, digits) == round(published / 1e9, digits)
    assert {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496}[name] == n
    assert cfg.ffn == {"llama3-8b": 14336, "llama3-70b": 28672}[name]


def test_llama3_8b_flops_per_token_match_megatron_and_torchtitan():
    """Llama 3 8B at s = 8192: 5.7913e10 FLOPs per token under the megatron convention, the
    figure of Megatron-LM core_v0.6-0.11's num_floating_point_operations, and torchtitan's
    6·(N - N_embedding) + 12·l·H·Q·s (5.7914e10: it also counts the norms' weights in N)."""
    cfg = LLAMA3["llama3-8b"]
    per_token = flops.model_flops_per_step(cfg, 1, "megatron") / cfg.seq_len
    assert per_token == pytest.approx(5.7913e10, rel=1e-4)
    assert flops.model_flops_per_step(cfg, 1, "palm") / cfg.seq_len == per_token
    h, l, V = cfg.hidden, cfg.layers, cfg.vocab
    titan = 6 * (flops.param_count(cfg) - V * h) + 12 * l * cfg.heads * cfg.head_dim * cfg.seq_len
    assert titan == pytest.approx(5.7914e10, rel=1e-4)
    # the difference is exactly the norms' weights (2 per layer and the final one), 6 FLOPs each
    assert titan - 6 * (l * 2 * h + h) == pytest.approx(per_token, rel=1e-12)
    assert LLAMA3["llama3-405b"].ffn == 53248
    assert flops.param_count(LLAMA3["llama3-405b"]) == 405_853_388_800


@pytest.mark.parametrize("kw", CONFIGS + [dict(bias=False)])
def test_param_tensors_count_the_model(kw):
    """``memory.stage_param_tensors`` (the tensors a per-tensor optimizer check visits)
    against the built model's parameter tensors (q, k, v separate, as scalestudy's models)."""
    from scalestudy.perf import memory

    cfg = Model(vocab=96, seq_len=16, layers=3, hidden=32, heads=4, **kw)
    with torch.device("meta"):
        assert memory.stage_param_tensors(cfg, 1, 0) == len(list(build_model(cfg).parameters()))
    # three stages: the embeddings on the first, the final norm and the head on the last (a
    # tied head is a tensor of its own there)
    split = sum(memory.stage_param_tensors(cfg, 3, r, 1) for r in range(3))
    assert split == memory.stage_param_tensors(cfg, 1, 0) + cfg.tied_embeddings
    # q, k, v (and SwiGLU's gate and up) fused: two tensors fewer each (with biases, four)
    per = (2 + (1 if cfg.mlp_matrices == 3 else 0)) * (2 if cfg.bias else 1)
    assert memory.stage_param_tensors(cfg, 1, 0) - memory.stage_param_tensors(
        cfg, 1, 0, fused_qkv=True) == 3 * per
