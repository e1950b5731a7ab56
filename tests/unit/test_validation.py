"""The step model against published tables (scalestudy.validation.published, .fit, .kernels and the
shared GPU constants): each piece of arithmetic by hand, the shipped tables' schema, and the
fit's bookkeeping. No accuracy threshold is asserted here: the validation's figures are read in
``scalestudy predict --validate`` and docs/performance-model.md."""

import math

import pandas as pd
import pytest

from scalestudy.config.parts import Model
from scalestudy.config import flops
from scalestudy.validation import series
from scalestudy.validation import fit
from scalestudy.perf import hardware, kernels, rates, stepmodel as sm
from scalestudy.validation import published as v
from scalestudy.perf import terms_compute as compute
from scalestudy.perf.hardware import HardwareSpec, Link

GPT = Model(layers=4, hidden=256, heads=8, vocab=1000, seq_len=128)
LLAMA = Model(arch="llama", layers=4, hidden=256, heads=8, kv_heads=2, vocab=1000, seq_len=128)


def row(**kw):
    """A published row in the shared schema (strings, as the CSV reader gives them)."""
    base = dict(table="t", row="r", device="A100-SXM4-80GB", gpus="8", framework="megatron-lm",
                arch="gpt", params_b="", layers="4", hidden="256", heads="8", kv_heads="",
                ffn_hidden="", vocab="1000", seq_len="128", tp="2", pp="1", dp="4", cp="1",
                vp="1", sequence_parallel="false", micro_batch="2", global_batch="16",
                recompute="full", dp_mode="ddp", flash_attention="false", precision="bf16",
                metric="tflops_per_gpu", value="100", flops_convention="megatron_recompute",
                peak_tflops="312", log_note="", source="", compile="false", steady_state="true")
    base.update({k: str(x) for k, x in kw.items()})
    return base


# --- kernel inventory -----------------------------------------------------------------------


def test_kernel_inventory_by_hand():
    h, f = 256, GPT.ffn
    # GPT: norms 2 x 2h, relayout 2h, residuals 2 x 3h, GELU 2f; 6 launches, any fusion
    for fusion in kernels.FUSION_LEVELS:
        k = kernels.layer_kernels(GPT, fusion)
        assert sum(e for _, e, _ in k) == 12 * h + 2 * f
        assert sum(n for *_, n in k) == 6
    # eager dropouts after attention and MLP: 2 x 3h more, 2 launches
    k = kernels.layer_kernels(GPT, "eager", dropout=True)
    assert sum(e for _, e, _ in k) == 18 * h + 2 * f and sum(n for *_, n in k) == 8
    assert kernels.layer_traffic(GPT, "fused") == 3 * (12 * h + 2 * f)
    # Llama eager: composite RMSNorm 2 x 18h (12 launches), rotary in fp32 10 (h + kv), repeat_kv
    # 2 (kv + h), relayout 2h, residuals 6h, SwiGLU 5f (2 launches)
    kv, ff = LLAMA.kv_dim, LLAMA.ffn
    e = kernels.layer_kernels(LLAMA, "eager")
    assert sum(x for _, x, _ in e) == pytest.approx(36 * h + 10 * (h + kv) + 2 * (kv + h) + 2 * h
                                                    + 6 * h + 5 * ff)
    assert sum(n for *_, n in e) == 12 + 6 + 2 + 1 + 2 + 2
    # fused (Megatron / TE, or compiled): norms 4h, rotary 2 (h + kv), SwiGLU 3f
    fz = kernels.layer_kernels(LLAMA, "fused")
    assert sum(x for _, x, _ in fz) == pytest.approx(4 * h + 2 * (h + kv) + 2 * h + 6 * h + 3 * ff)
    # per TP rank: the intermediates always split, the hidden-wide tensors only with SP
    assert sum(x for _, x, _ in kernels.layer_kernels(GPT, "fused", tp=2)) == 11 * h + f
    assert sum(x for _, x, _ in kernels.layer_kernels(GPT, "fused", tp=2, sp=True)) == 6 * h + f
    with pytest.raises(ValueError, match="fusion"):
        kernels.layer_kernels(GPT, "jit")
    # biases added outside the products (Megatron v1): q/k/v and the MLP's up per TP rank, the
    # two row-parallel outputs hidden-wide; 4 launches; nothing for a model without biases
    for tp in (1, 4):
        extra = (sum(x for _, x, _ in kernels.layer_kernels(GPT, "eager", tp=tp, bias_add=True))
                 - sum(x for _, x, _ in kernels.layer_kernels(GPT, "eager", tp=tp)))
        assert extra == pytest.approx(3 * h / tp + f / tp + 2 * h)
    assert sum(n for *_, n in kernels.layer_kernels(GPT, "eager", bias_add=True)) == 10
    assert kernels.layer_kernels(LLAMA, "eager", bias_add=True) == kernels.layer_kernels(LLAMA, "eager")


def test_softmax_and_loss_traffic_by_hand():
    assert kernels.softmax_elements("fused") == (2.0, 3.0)
    assert kernels.softmax_elements("eager") == (7.0, 7.0)
    assert kernels.softmax_elements("fused", dropout=True) == (5.0, 6.0)
    assert kernels.loss_bytes_per_logit("fused", 2) == 20.0
    assert kernels.loss_bytes_per_logit("eager", 2) == 32.0
    assert kernels.loss_bytes_per_logit("eager", 4) == 20.0  # fp32 logits need no casts


def test_batched_products_are_quantised_together():
    # 128 x 128 on 128 x 128 tiles: one tile; alone it fills 1 of 108 SMs, a batch of 108 one wave
    assert rates.tile_wave_efficiency(128, 128, (128, 128), 108) == pytest.approx(1 / 108)
    assert rates.tile_wave_efficiency(128, 128, (128, 128), 108, batch=108) == pytest.approx(1.0)
    assert rates.tile_wave_efficiency(128, 128, (128, 128), 108, batch=109) == pytest.approx(109 / 216)
    hw = HardwareSpec(name="t", device="t", devices_per_node=8, peak_flops={"bf16": 1e12},
                      memory_bytes=1e12, mem_bw=1e30, matmul_efficiency=0.5, intra=Link(1, 0),
                      gemm_tile=(128, 128), multiprocessors=108)
    one = rates.gemm_seconds(128, 128, 64, 108, "bf16", hw)
    batched = rates.gemm_seconds(128, 128, 64, 108, "bf16", hw, batched=True)
    assert one == pytest.approx(108 * batched)


def test_launch_gaps_by_hand():
    c = compute.LayerCosts(*([0.0] * 11), measured=False, launches_fwd=10, launches_bwd=18)
    hw = HardwareSpec(name="t", device="t", devices_per_node=8, peak_flops={"bf16": 1e12},
                      memory_bytes=1e12, mem_bw=1e12, matmul_efficiency=0.5, intra=Link(1, 0),
                      kernel_gap_s=2e-6)
    # 3 layers forward + backward, 2 of them recomputed, the head and loss on the last stage
    assert compute.launch_gap_seconds(c, 3, 2, True, hw) == pytest.approx(
        2e-6 * (3 * 28 + 2 * 10 + compute.HEAD_LAUNCHES))
    assert compute.launch_gap_seconds(c, 3, 0, False, hw) == pytest.approx(2e-6 * 84)
    from dataclasses import replace

    assert compute.launch_gap_seconds(c, 3, 0, False, replace(hw, kernel_gap_s=0.0)) == 0.0


def test_power_limit_and_shared_gpu_constants():
    assert hardware.power_factor(500, 700, 1 / 3) == pytest.approx((5 / 7) ** (1 / 3))
    assert hardware.power_factor(None, 700, 1 / 3) == 1.0
    assert hardware.power_factor(800, 700, 1 / 3) == 1.0
    shared = hardware.gpu_constants()
    gt = HardwareSpec.load("grand-teton-h100")
    assert gt.power_factor == pytest.approx(0.795 * (500 / 700) ** shared["power_exponent"].value)
    assert HardwareSpec.load("dgx-h100").power_factor == 0.795  # the documented sustained clock
    assert HardwareSpec.load("dgx-a100").power_factor == 1.0  # none documented
    assert gt.mem_bw == 2.4e12 and gt.framework.name == "torchtitan"
    # every GPU system shares the sustained fraction and the launch gap; a CPU host does not
    for name in ("frontier", "dgx-a100", "dgx-h100", "h200", "dgx2h-v100", "grand-teton-h100"):
        hw = HardwareSpec.load(name)
        assert hw.sustained == shared["sustained"].value
        assert hw.kernel_gap_s == shared["kernel_gap_s"].value
    cpu = HardwareSpec.load("cpu-local")  # measured: none of the GPU constants
    assert cpu.sustained == 1.0 and cpu.kernel_gap_s == 0.0 and cpu.power_factor == 1.0
    # the sustained fraction scales the declared GEMM rate
    a = HardwareSpec.load("dgx-a100")
    assert rates.gemm_efficiency(8192, 8192, 8192, a) == pytest.approx(
        a.matmul_efficiency * a.sustained * rates.tile_wave_efficiency(8192, 8192, a.gemm_tile, 108))


# --- validation rows ------------------------------------------------------------------------


def test_case_from_a_row_and_its_readings():
    c = v.case(row())
    assert not c.skip and (c.system, c.framework) == ("dgx-a100", "megatron-lm")
    assert len(c.variants) == 1 and c.ranged == ()
    p = c.point
    assert (p.n, p.tp, p.pp, p.dp, p.micro_batch, p.grad_accum) == (8, 2, 1, 4, 2, 2)
    assert p.parallel.activation_checkpointing == "full" and p.model.attention == "math"
    # what a table leaves unsaid is read every admissible way, never skipped
    fp8 = v.case(row(precision="fp8"))
    assert fp8.ranged == ("fp8_speedup",)
    assert [x.fp8_speedup for x in fp8.variants] == list(v.FP8_SPEEDUP)
    assert v.case(row(cp=2, gpus=16)).point.cp == 2
    assert not v.case(row(steady_state="false")).skip
    conv = v.case(row(convention_stated="false"))
    assert conv.ranged == ("flops_convention",) and len(conv.variants) == 3
    assert v.case(row(convention_stated="false", metric="iteration_s")).ranged == ()
    rec = v.case(row(recompute=""))
    assert rec.ranged == ("recompute",)
    assert {x.point.parallel.activation_checkpointing for x in rec.variants} == {
        "none", "selective_attention", "full"}
    assert {x.point.parallel.dp_mode for x in v.case(row(dp_mode="")).variants} == {"ddp", "zero1"}
    # Megatron-LM interleaves only even stages: 8 layers on 2 ranks in 2 or 4 virtual stages,
    # with micro-batches that divide by pp; a framework that splits unevenly takes 3 as well
    vp = v.case(row(pp=2, dp=2, vp="", layers=8))
    assert vp.ranged == ("vp",) and {x.point.parallel.virtual_stages for x in vp.variants} == {2, 4}
    odd_m = v.case(row(pp=2, dp=2, vp="", layers=8, global_batch=12))  # 3 micro-batches
    assert odd_m.skip.startswith("no admissible layout") and "divide by pp=2" in odd_m.skip
    core = v.case(row(pp=2, dp=2, vp="", layers=8, framework="megatron-core"))
    assert {x.point.parallel.virtual_stages for x in core.variants} == {2, 3, 4}
    mb = v.case(row(micro_batch=""))  # local batch 16 / 4 = 4: micro-batches 1, 2, 4
    assert {x.point.micro_batch for x in mb.variants} == {1, 2, 4}
    odd = v.case(row(global_batch="18", micro_batch=1))  # 18 do not split over dp=4: 16 or 20
    assert {x.point.global_batch for x in odd.variants} == {16, 20}
    assert {x.point.model.vocab for x in v.case(row(vocab="")).variants} == set(v.VOCABS)
    heads = v.case(row(heads=""))  # hidden 256: head dim 128 or 64
    assert {x.point.model.heads for x in heads.variants} == {2, 4}
    prec = v.case(row(framework="megatron-deepspeed", precision=""))
    assert {x.framework for x in prec.variants} == {"megatron-deepspeed-bf16", "megatron-deepspeed"}
    assert prec.ranged == ("precision",)
    # only a row whose FLOPs cannot be counted leaves, or one on an undescribed device
    assert v.case(row(tp="")).skip.startswith("FLOPs cannot be counted")
    assert "hidden" in v.case(row(hidden="")).skip
    assert "no system preset" in v.case(row(device="TPUv4")).skip
    assert "no framework description" in v.case(row(framework="jax")).skip
    assert v.case(row(metric="loss")).skip.startswith("metric")
    assert v.case(row(device="H100-HBM2e-500W")).system == "grand-teton-h100"
    assert v.case(row(framework="torchtitan-asynctp")).framework == "torchtitan-asynctp"
    # DeepSpeed runs bf16 and fp16 through different optimizers: two descriptions
    assert v.case(row(framework="megatron-deepspeed")).framework == "megatron-deepspeed-bf16"
    assert v.case(row(framework="megatron-deepspeed", precision="fp16")).framework == \
        "megatron-deepspeed"
    assert v.framework_of("Megatron-LM", "bf16") == "megatron-lm"
    # Megatron-LM v1 offers two DDP implementations and no table says which ran: a
    # data-parallel row is read under both, a row without data parallelism under its own
    v1 = v.case(row(framework="megatron-lm-2019", precision="fp16"))
    assert v1.ranged == ("dp_impl",) and [x.framework for x in v1.variants] == [
        "megatron-lm-2019", "megatron-lm-2019-torch-ddp"]
    assert v1.variants[0].point == v1.variants[1].point
    assert v.case(row(framework="megatron-lm-2019", precision="fp16", dp=1, gpus=2,
                      global_batch=4)).ranged == ()
    assert v.case(row(framework="megatron-lm-2019", dp_mode="zero1")).ranged == ()
    # a row's MLP where it is not its arch's default (Nemotron: grouped-query attention, a
    # non-gated two-matrix MLP)
    gqa = v.case(row(arch="llama", mlp="gelu", kv_heads=2, ffn_hidden=1024)).point.model
    assert (gqa.arch, gqa.mlp, gqa.n_kv_heads, gqa.mlp_matrices, gqa.tied_embeddings) == (
        "llama", "gelu", 2, 2, False)
    assert v.case(row(arch="llama")).point.model.mlp == "swiglu"
    assert v.case(row(compile="true")).point.train.compile
    # layers that do not divide into the stages split by parameters
    assert v.partition_of("megatron-core", 126, 16) == "parameters"
    assert v.partition_of("megatron-core", 128, 16) == "uniform"
    assert v.partition_of("megatron-lm", 126, 16) == "uniform"  # then refused: uneven


def test_range_holds_every_reading_and_the_central_is_their_median():
    specs = v.systems()
    c = v.case(row(recompute="", metric="iteration_s"))
    out = v.predict_case(c, specs, ranges=False)
    times = sorted(sm.predict_step_time(x.point, specs[("dgx-a100", x.framework)]).step_time_s
                   for x in c.variants)
    assert out["predicted"] == pytest.approx(times[1])
    assert (out["predicted_low"], out["predicted_high"]) == pytest.approx((times[0], times[-1]))
    wide = v.predict_case(c, specs)  # the assumptions' spread widens it
    assert wide["predicted_low"] < times[0] and wide["predicted_high"] > times[-1]
    assert wide["inside"] == (wide["predicted_low"] <= c.published <= wide["predicted_high"])
    # fp8 products at the stated speed-up, the attention kernel as fast as in bf16
    hw = HardwareSpec.load("dgx-h100").with_framework("torchtitan")
    fast = v.fp8_products(hw, 2.0)
    assert fast.peak("bf16") == 2 * hw.peak("bf16")
    assert fast.attention_efficiency * fast.peak("bf16") == pytest.approx(
        hw.attention_efficiency * hw.peak("bf16"))


def test_predicted_value_per_metric_by_hand():
    c = v.case(row())
    hw = HardwareSpec.load("dgx-a100").with_framework("megatron-lm")
    b = sm.predict_step_time(c.point, hw)
    t, n, gb = b.step_time_s, 8, 16
    peak = hw.peak("bf16")
    hfl = flops.hardware_flops_per_step(c.point.model, gb, "megatron", "full")
    p = c.point
    assert v.predicted_value("tflops_per_gpu", "megatron_recompute", p, b, peak) == \
        pytest.approx(hfl / (t * n) / 1e12)
    for metric, want in (("iteration_s", t), ("tokens_per_s_per_gpu", gb * 128 / (t * n)),
                         ("hfu_pct", 100 * hfl / (t * n * peak))):
        assert v.predicted_value(metric, "none", p, b, peak) == pytest.approx(want)
    mfl = flops.model_flops_per_step(p.model, gb)
    assert v.predicted_value("mfu_pct", "megatron", p, b, peak) == \
        pytest.approx(100 * mfl / (t * n * peak))
    palm = flops.model_flops_per_step(p.model, gb, "palm")
    assert v.predicted_value("mfu_pct", "palm", p, b, peak) == \
        pytest.approx(100 * palm / (t * n * peak))
    # every metric as a per-device FLOP rate, so that a series whose model grows compares
    var = c.variants[0]
    assert series.flops_rate("tflops_per_gpu", 100, var, peak) == 1e14
    assert series.flops_rate("mfu_pct", 50, var, peak) == pytest.approx(0.5 * peak)
    assert series.flops_rate("iteration_s", t, var, peak) == pytest.approx(
        v.convention_flops(p, var.convention) / (t * n))
    # positive error = the model is optimistic, for times too
    assert v.error("tflops_per_gpu", 110, 100) == pytest.approx(0.1)
    assert v.error("iteration_s", 90, 100) == pytest.approx(0.1)


def test_summary_by_hand():
    rows = pd.DataFrame([
        {"table": "a", "row": "x", "skip": "", "error": 0.1},
        {"table": "a", "row": "y", "skip": "", "error": -0.3},
        {"table": "a", "row": "z", "skip": "fp8", "error": math.nan},
        {"table": "b", "row": "w", "skip": "cp", "error": math.nan}])
    s = v.summary(rows).set_index("table")
    assert s.loc["a", "rows"] == 2 and s.loc["a", "skipped"] == 1
    assert "coverage" not in s  # rows without ranges
    rows["inside"], rows["width"] = [True, False, None, None], [0.2, 0.4, None, None]
    s = v.summary(rows).set_index("table")
    assert s.loc["a", "coverage"] == 0.5 and s.loc["a", "median_width"] == pytest.approx(0.3)
    assert s.loc["a", "mape"] == pytest.approx(0.2) and s.loc["a", "bias"] == pytest.approx(-0.1)
    assert s.loc["a", "worst_row"] == "y" and s.loc["b", "rows"] == 0


def test_every_shipped_table_loads_and_states_its_sources():
    names = v.table_names()
    assert v.FRONTIER in names and len(names) >= 6
    for name in names:
        if name == v.FRONTIER:
            continue
        df = v.load_table(name)
        assert set(v.COLUMNS) <= set(df) and (df["table"] == name).all(), name
        assert (df["source"].str.len() > 20).all(), name
        assert set(df["metric"]) <= set(v.METRICS), name
        assert df["value"].astype(float).gt(0).all(), name


def test_bad_convention_is_refused(tmp_path, monkeypatch):
    import importlib.resources as res

    d = tmp_path / "scalestudy" / "data" / "published"
    d.mkdir(parents=True)
    pd.DataFrame([row(flops_convention="6N-ish")]).to_csv(d / "t.csv", index=False)
    monkeypatch.setattr(res, "files", lambda pkg: tmp_path / "scalestudy")
    with pytest.raises(ValueError, match="flops_convention"):
        v.load_table("t")


# --- the fit --------------------------------------------------------------------------------


def test_objective_weighs_tables_equally_and_best_refines_the_grid():
    def rows(errs):
        return pd.DataFrame([{"table": t, "skip": "", "error": e} for t, e in errs])

    r = rows([("a", 0.1), ("a", 0.1), ("a", 0.1), ("b", -0.5)])
    want = (abs(math.log(1.1)) + abs(math.log(0.5))) / 2
    assert fit.objective(r, ["a", "b"]) == pytest.approx(want)
    assert fit.objective(r, ["c"]) == math.inf
    # errors that are a parabola in the constant around 0.63: the refined minimum
    errs = {x: rows([("a", 0.5 * (x - 0.63) ** 2 + 1e-9)]) for x in (0.5, 0.6, 0.7, 0.8)}
    assert fit.best(errs, ["a"]) == pytest.approx(0.63, abs=0.01)


def test_shipped_fit_matches_its_declared_subset():
    f = hardware.fitted()
    assert f["fit"]["tables"] == list(fit.FIT_TABLES) and f["fit"]["fitted_constants"] == 1
    c = f["constants"]["sustained"]
    assert c["low"] <= c["value"] <= c["high"]
    assert hardware.gpu_constants()["sustained"].value == c["value"]
    for t, rec in f["fit"]["per_table"].items():
        assert rec["in_fit"] == (t in fit.FIT_TABLES)
