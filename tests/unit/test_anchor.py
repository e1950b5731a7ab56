"""Anchored series prediction (scalestudy.perf.anchor) and the published series it is judged on
(scalestudy.validation.series.series_rows): the rate is recovered from a step the model itself
gave, a series generated at a known rate is predicted without error, and the band holds the
central curve. Pure: no torch.distributed."""

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Parallel
from scalestudy.validation import published as v
from scalestudy.validation import series
from scalestudy.perf import anchor
from scalestudy.perf.hardware import HardwareSpec

GPT = Model(layers=8, hidden=1024, heads=16, vocab=32000, seq_len=1024)
HW = HardwareSpec.load("dgx-a100").with_framework("megatron-lm")


def weak_series(ns=(8, 16, 32, 64)):
    """DP weak scaling with 2-way pipelines: micro-batch 1, 8 micro-batches per pipeline."""
    return [Point.build(GPT, n=n, tp=2, pp=2, micro_batch=1, global_batch=8 * n // 4,
                        parallel=Parallel(dp_mode="ddp")) for n in ns]


def test_rate_is_recovered_from_a_step_the_model_gave():
    p = weak_series()[0]
    for rate in (0.5, 0.8, 1.0, 1.25):
        step = anchor.step_at_rate(p, HW, rate)
        assert anchor.solve_rate(p, HW, step) == pytest.approx(rate, rel=1e-5)
    # a slower measurement means slower software
    s1 = anchor.step_at_rate(p, HW, 1.0)
    assert anchor.solve_rate(p, HW, 1.2 * s1) < anchor.solve_rate(p, HW, s1)
    # two anchors: the geometric mean of their rates
    q = weak_series()[1]
    both = anchor.anchored_rate([(p, anchor.step_at_rate(p, HW, 0.64)),
                                 (q, anchor.step_at_rate(q, HW, 1.0))], HW)
    assert both == pytest.approx(0.8, rel=1e-4)
    with pytest.raises(ValueError, match="step time"):
        anchor.solve_rate(p, HW, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        anchor.anchored_rate([], HW)


def test_series_at_a_known_rate_is_predicted_back():
    pts = weak_series()
    rate = 0.7
    truth = [anchor.per_device_rate(p, anchor.step_at_rate(p, HW, rate)) for p in pts]
    out = anchor.predict_series(pts, [(pts[0], anchor.step_at_rate(pts[0], HW, rate))], HW)
    assert [s.n for s in out] == [8, 16, 32, 64]
    assert [s.anchored for s in out] == [True, False, False, False]
    for s, x in zip(out, truth):
        assert s.rate == pytest.approx(rate, rel=1e-5)
        assert s.tokens_per_s_per_device == pytest.approx(x, rel=1e-5)
        assert s.efficiency == pytest.approx(x / truth[0], rel=1e-5)
        assert s.efficiency_low <= s.efficiency + 1e-12 and s.efficiency <= s.efficiency_high + 1e-12
    assert out[0].efficiency == pytest.approx(1.0)
    # communication grows with N at a fixed micro-batch count: efficiency cannot exceed 1
    assert out[-1].efficiency <= 1.0 + 1e-9


def test_published_series_generated_by_the_model_has_no_error():
    """Two rows of one series whose published figures the model itself gave at one rate."""
    specs = v.systems()
    hw = specs[("dgx-a100", "megatron-lm")]

    def row(n, value):
        return dict(table="t", row=f"n{n}", device="A100-SXM4-80GB", gpus=str(n),
                    framework="megatron-lm", arch="gpt", params_b="", layers="8", hidden="1024",
                    heads="16", kv_heads="", ffn_hidden="", vocab="32000", seq_len="1024", tp="2",
                    pp="2", dp=str(n // 4), cp="1", vp="1", sequence_parallel="false",
                    micro_batch="1", global_batch=str(2 * n), recompute="none", dp_mode="ddp",
                    flash_attention="false", precision="bf16", metric="iteration_s",
                    value=str(value), flops_convention="none", peak_tflops="312", log_note="",
                    source="", series="weak-dp", scaling="weak")

    steps = {n: anchor.step_at_rate(v.case(row(n, 1.0)).point, hw, 0.75) for n in (8, 64)}
    out, = series.series_rows([v.case(row(n, t)) for n, t in steps.items()], specs)
    assert (out["n0"], out["n"], out["scaling"]) == (8, 64, "weak")
    assert out["rate"] == pytest.approx(0.75, rel=1e-4)
    assert out["error_points"] == pytest.approx(0.0, abs=1e-3)
    assert out["predicted_low"] <= out["predicted_efficiency"] <= out["predicted_high"]
    assert out["published_efficiency"] == pytest.approx(steps[8] / steps[64], rel=1e-9)


def test_series_reads_what_is_unsaid_alike_at_both_ends():
    """A series whose rows leave recompute unsaid: each reading is anchored and predicted
    with the same recompute at both ends; readings that need an implausible rate drop out."""
    specs = v.systems()
    hw = specs[("dgx-a100", "megatron-lm")]
    assert series.rate_plausible(hw, 1.0) and not series.rate_plausible(hw, 0.5)
    assert not series.rate_plausible(hw, 2.0)
    assert series.rate_plausible(HardwareSpec.load("cpu-local"), 50.0)  # no stated range

    def row(n, value, recompute=""):
        return dict(table="t", row=f"n{n}", device="A100-SXM4-80GB", gpus=str(n),
                    framework="megatron-lm", arch="gpt", params_b="", layers="8", hidden="1024",
                    heads="16", kv_heads="", ffn_hidden="", vocab="32000", seq_len="1024", tp="2",
                    pp="2", dp=str(n // 4), cp="1", vp="1", sequence_parallel="false",
                    micro_batch="1", global_batch=str(2 * n), recompute=recompute, dp_mode="ddp",
                    flash_attention="false", precision="bf16", metric="iteration_s",
                    value=str(value), flops_convention="none", peak_tflops="312", log_note="",
                    source="", series="s", scaling="weak")

    # the runs recomputed everything, at rate 0.9
    steps = {n: anchor.step_at_rate(v.case(row(n, 1.0, "full")).point, hw, 0.9) for n in (8, 64)}
    cases = [v.case(row(n, t)) for n, t in steps.items()]
    keys = [{series.reading_key(x, c.ranged) for x in c.variants} for c in cases]
    assert keys[0] == keys[1] and len(keys[0]) == 3  # none, selective, full at both ends
    out, = series.series_rows(cases, specs)
    assert out["readings"] in (1, 2, 3)
    assert series.rate_plausible(hw, out["rate"])
    assert out["predicted_low"] <= out["published_efficiency"] <= out["predicted_high"]


def test_a_weak_series_whose_model_grows_is_read_alike_at_both_ends():
    """Published fields may change along a series (a weak series' heads grow with its
    model); what is unsaid (here the FLOPs convention) pairs the ends: each reading the same
    convention at both ends (one needs an implausible rate and drops out)."""
    specs = v.systems()

    def row(n, hidden, heads, value):
        return dict(table="t", row=f"n{n}", device="V100-SXM3-32GB", gpus=str(n),
                    framework="megatron-lm-2019", arch="gpt", params_b="", layers="8",
                    hidden=str(hidden), heads=str(heads), kv_heads="", ffn_hidden="",
                    vocab="51200", seq_len="1024", tp=str(n), pp="1", dp="1", cp="1", vp="1",
                    sequence_parallel="false", micro_batch="8", global_batch="8",
                    recompute="full", dp_mode="ddp", flash_attention="false", precision="fp16",
                    metric="tflops_per_gpu", value=str(value), flops_convention="megatron",
                    convention_stated="false", peak_tflops="", log_note="", source="",
                    series="s", scaling="weak")

    cases = [v.case(row(1, 1536, 16, 39.0)), v.case(row(8, 3072, 32, 30.0))]
    assert all(c.ranged == ("flops_convention",) for c in cases)
    out, = series.series_rows(cases, specs)
    assert out["readings"] == 2
    effs = [series.anchored_efficiency("tflops_per_gpu", cases[0], cases[1], a, b, specs)
            for a, b in zip(cases[0].variants, cases[1].variants)]
    kept = sorted(e for e, rate in effs if series.rate_plausible(
        specs[("dgx2h-v100", "megatron-lm-2019")], rate))
    assert len(kept) == 2 and out["predicted_efficiency"] == pytest.approx(kept[0])
