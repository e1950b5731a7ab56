"""Performance model: hand-computed cases and the shipped presets."""

import pytest

from scalestudy.config.parts import Model
from scalestudy.measure.memory import memory_point
from scalestudy.config import flops
from scalestudy.perf import hardware, terms_compute as compute
from scalestudy.perf.hardware import HardwareSpec, Link
from scalestudy.perf.rates import Measured, collective_time
from scalestudy.perf.stepmodel import predict_step_time

MODEL = dict(vocab=1000, seq_len=128, layers=8, hidden=256, heads=8)


def ideal_hw(**kw):
    """1 TFLOP/s at 100% efficiency, no elementwise/optimizer cost (infinite memory bandwidth)."""
    d = dict(name="ideal", device="ideal", devices_per_node=8, peak_flops={"fp32": 1e12, "bf16": 1e12},
             memory_bytes=1e12, mem_bw=1e30, matmul_efficiency=1.0,
             intra=Link(1e10, 1e-5), inter=Link(1e9, 1e-4))
    d.update(kw)
    return HardwareSpec(**d)


def point(dp=1, tp=1, pp=1, mb=2, m=1, ckpt="none", dp_mode="ddp", schedule="1f1b", v=1,
          mlp="gelu"):
    p = memory_point(dict(MODEL, mlp=mlp), mb, ckpt, dp=dp, tp=tp, pp=pp, grad_accum=m,
                     dp_mode=dp_mode, pp_schedule=schedule, virtual_stages=v)
    assert (p.n, p.global_batch) == (dp * tp * pp, dp * mb * m)
    return p


def fwd_flops(b, s=128, l=8, h=256, V=1000):
    return l * (2 * (4 * h * h + 2 * h * 4 * h) * s * b + 4 * s * s * h * b) + 2 * s * b * h * V


def test_collective_ring_cost_by_hand():
    link = Link(1e10, 1e-5)
    assert collective_time("all_reduce", 1e9, 4, link) == pytest.approx(1e-5 + 1.5 * 0.1)
    assert collective_time("all_gather", 1e9, 4, link) == pytest.approx(1e-5 + 0.75 * 0.1)
    assert collective_time("send_recv", 1e9, 2, link) == pytest.approx(1e-5 + 0.1)
    assert collective_time("all_reduce", 1e9, 1, link) == 0.0
    pair = Link(1e10, 0.0, bandwidth_pair=4e10)
    assert collective_time("all_reduce", 1e9, 2, pair) == pytest.approx(1e9 / 4e10)
    assert collective_time("all_reduce", 1e9, 2, pair, adjacent=False) == pytest.approx(0.1)


def test_single_device_compute_only_by_hand():
    r = predict_step_time(point(mb=2), ideal_hw())
    assert r.compute_s == pytest.approx(3 * fwd_flops(2) / 1e12, rel=1e-9)
    assert r.step_time_s == pytest.approx(r.compute_s, rel=1e-9)
    assert r.model_flops_per_step == pytest.approx(3 * fwd_flops(2))
    assert r.mfu == pytest.approx(1.0)
    # megatron Eq. 3 for GELU 4h: 72 B s l h^2 (1 + s/6h + V/12lh)
    B, s, l, h, V = 2, 128, 8, 256, 1000
    assert r.model_flops_per_step == pytest.approx(
        72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)))


def test_full_checkpointing_recompute():
    r = predict_step_time(point(mb=2, ckpt="full"), ideal_hw())
    layers_fwd = fwd_flops(2) - 2 * 128 * 2 * 256 * 1000
    assert r.compute_s == pytest.approx((3 * fwd_flops(2) + layers_fwd) / 1e12)
    assert r.hfu == pytest.approx(1.0)
    assert r.mfu < r.hfu


def test_tensor_parallel_all_reduces_by_hand():
    r = predict_step_time(point(tp=2, mb=2), ideal_hw())
    msg = 2 * 128 * 256 * 4  # b s h fp32
    per = 1e-5 + 1.0 * msg / 1e10  # 2(p-1)/p = 1 at p = 2
    # embedding all-reduce; head: all-gather of the fp32 logits (p-1)/p = 1/2, input-grad all-reduce
    edges = per + (1e-5 + 0.5 * 2 * 128 * 1000 * 4 / 1e10) + per
    assert r.tp_comm_s == pytest.approx(4 * 8 * per + edges)
    r6 = predict_step_time(point(tp=2, mb=2, ckpt="full"), ideal_hw())
    assert r6.tp_comm_s == pytest.approx(6 * 8 * per + edges)
    assert r.compute_s == pytest.approx(3 * fwd_flops(2) / 2 / 1e12)


def test_pipeline_bubble_by_hand():
    """1F1B on 4 stages of 2 layers, 8 micro-batches: the last stage (with the head) is the
    bottleneck; the fill and drain cost the other stages' slots once each; the torch
    framework's 2 serial transfers per neighbour put 2 on the edge stages, 4 in the middle."""
    r = predict_step_time(point(pp=4, m=8), ideal_hw())
    L = 3 * flops.layer_forward_flops(Model(**MODEL), 2) / 1e12
    H = 3 * 2 * 128 * 2 * 256 * 1000 / 1e12
    t = 1e-5 + 2 * 128 * 256 * 4 / 1e10  # one fp32 activation transfer, intra-node
    slots = [2 * L + 2 * t, 2 * L + 4 * t, 2 * L + 4 * t, 2 * L + H + 2 * t]
    assert r.bottleneck_stage == 3
    assert r.micro_batch_slot_s == pytest.approx(slots[3])
    assert r.pp_bubble_s == pytest.approx(sum(slots[:3]))
    assert r.bubble_fraction == pytest.approx(sum(slots[:3]) / (8 * slots[3]))
    assert r.pp_p2p_s == pytest.approx(8 * 2 * t)
    assert r.step_time_s == pytest.approx(8 * slots[3] + sum(slots[:3]) + r.dp_comm_exposed_s
                                          + r.optimizer_s)
    assert r.step_time_s == pytest.approx(sum(r.terms().values()))
    # interleaving: each rank runs 2 chunks, twice the transfers, half the fill and drain
    ri = predict_step_time(point(pp=4, m=8, schedule="interleaved1f1b", v=2), ideal_hw())
    assert ri.pp_p2p_s == pytest.approx(2 * r.pp_p2p_s)
    si = [2 * L + 4 * t, 2 * L + 8 * t, 2 * L + 8 * t]
    assert ri.pp_bubble_s == pytest.approx(sum(si) / 2)


def test_data_parallel_volume_and_overlap():
    hw = ideal_hw()
    ddp = predict_step_time(point(dp=4, mb=2), hw, dp_overlap=0.0)
    grad = memory_point(MODEL, 2, "none")
    P = flops.param_count(Model(**MODEL))
    assert ddp.dp_comm_s == pytest.approx(1e-5 + 1.5 * 4 * P / 1e10)
    assert ddp.dp_comm_exposed_s == pytest.approx(ddp.dp_comm_s)
    z1 = predict_step_time(point(dp=4, mb=2, dp_mode="zero1"), hw, dp_overlap=0.0)
    assert z1.dp_comm_s == pytest.approx(ddp.dp_comm_s + 1e-5)  # same volume, 2 calls
    hidden = predict_step_time(point(dp=4, mb=2), hw, dp_overlap=1.0)
    assert hidden.dp_comm_exposed_s == pytest.approx(
        max(0.0, ddp.dp_comm_s - hidden.compute_s * 2 / 3))
    assert grad.micro_batch == 2
    # across nodes the inter-node link applies: 8 devices per node, tp 4 x dp 4 spans 2
    x = predict_step_time(point(dp=4, tp=4, mb=2), hw)
    assert x.dp_link == "inter"


def test_measured_fits_and_lookup():
    rows = [{"op": "all_reduce", "group_size": 2, "bytes": n, "sample": 0,
             "seconds": 1e-4 + n / 1e9} for n in (1e3, 1e6, 1e7)]
    m = Measured.from_frames(None, rows)
    a, b = m.collectives[("all_reduce", 2)]
    assert a == pytest.approx(1e-4) and b == pytest.approx(1e9)
    # another group size: rescaled by the ring factor 2(p-1)/p: 1.5 at p=4 vs 1.0 at p=2
    assert m.collective_time("all_reduce", 1e6, 4) == pytest.approx(1e-4 + 1.5 * 1e6 / 1e9)
    mm = [{"dtype": "fp32", "m": 64, "n": 64, "k": 64, "flops_per_s": 1e9},
          {"dtype": "fp32", "m": 512, "n": 512, "k": 512, "flops_per_s": 4e9}]
    m2 = Measured.from_frames(mm)
    assert m2.matmul_rate("fp32", 400, 600, 500) == 4e9
    assert m2.matmul_rate("fp32", 32, 64, 80) == 1e9
    assert m2.matmul_rate("bf16", 32, 64, 80) is None


def test_presets_load_with_sources():
    assert {"frontier", "h200", "cpu-local"} <= set(hardware.presets())
    fr = HardwareSpec.load("frontier")
    assert fr.peak("bf16") == 191.5e12 and fr.memory_bytes == 64e9 and fr.devices_per_node == 8
    assert fr.inter.bandwidth == 12.5e9 and fr.intra.bw(2) == 200e9 and fr.intra.bw(4) == 50e9
    assert HardwareSpec.load("h200").peak("bf16") == 989e12
    with pytest.raises(ValueError, match="no such preset"):
        HardwareSpec.load("nonexistent-machine")
    # the error names the field of the hardware description to add (peak_tflops in
    # hardware.yaml; it was peak_flops in the per-preset YAML files)
    with pytest.raises(ValueError, match="declares no peak for 'int8'.*peak_tflops"):
        fr.peak("int8")


def test_layer_selective_recomputes_every_other_layer():
    hw = ideal_hw()
    none = predict_step_time(point(tp=2, mb=2), hw)
    full = predict_step_time(point(tp=2, mb=2, ckpt="full"), hw)
    sel = predict_step_time(point(tp=2, mb=2, ckpt="selective"), hw)
    # 8 layers: 4 recomputed -> half the extra compute and half the extra all-reduces of full
    assert sel.compute_s - none.compute_s == pytest.approx((full.compute_s - none.compute_s) / 2)
    assert sel.tp_comm_s - none.tp_comm_s == pytest.approx((full.tp_comm_s - none.tp_comm_s) / 2)


def test_tp_larger_than_node_is_rejected():
    with pytest.raises(ValueError, match="devices_per_node"):
        predict_step_time(point(tp=16, mb=2), ideal_hw())


@pytest.mark.parametrize("ckpt", ["none", "full", "selective", "selective_attention"])
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_flops_agree_with_flops_module(ckpt, mlp):
    # The step model's own FLOPs count is gone: it reports the flops module's figures, and
    # the matrix products it times add up to the same FLOPs.
    p = point(mb=2, m=3, ckpt=ckpt, mlp=mlp)
    cfg, rows = p.model, p.global_batch
    assert cfg.mlp == mlp and rows == 6
    r = predict_step_time(p, ideal_hw())
    assert r.model_flops_per_step == pytest.approx(
        flops.model_flops_per_step(cfg, rows, "megatron"))
    assert r.hardware_flops_per_step == pytest.approx(
        flops.hardware_flops_per_step(cfg, rows, "megatron", ckpt))
    gemms = compute.layer_gemms(cfg, cfg.seq_len, p.micro_batch)
    assert sum(2 * M * N * K * c for M, N, K, c in gemms) == pytest.approx(
        flops.layer_forward_flops(cfg, p.micro_batch))
    # at 1 FLOP/s per 1e-12 s and no memory cost, compute time is the hardware FLOPs
    assert r.compute_s * 1e12 == pytest.approx(
        flops.hardware_flops_per_step(cfg, rows, "megatron", ckpt), rel=1e-9)


def test_calibration_as_matmul_ceiling(tmp_path):
    import json

    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"device_name": "x", "device_type": "cpu", "dtype": "fp32", "m": 256,
                               "n": 256, "k": 256, "flops_per_s": 2e9}))
    m = Measured.from_calibration(cal)
    assert m.matmul_rate("fp32", 64, 64, 64) == 2e9
    r = predict_step_time(point(mb=2), ideal_hw(), m)
    assert r.matmul_rate_source == "measured"
    assert r.compute_s == pytest.approx(3 * fwd_flops(2) / 2e9, rel=1e-6)


def test_calibrated_shapes_are_used_per_product(tmp_path):
    import json

    from scalestudy.plan.planner import plan_points

    cal = tmp_path / "calibration.json"
    cal.write_text(json.dumps({"dtype": "fp32", "m": 512, "n": 512, "k": 512, "flops_per_s": 8e10,
                               "shapes": [{"m": 256, "n": 256, "k": 256, "flops_per_s": 2e10}]}))
    m = Measured.from_calibration(cal)
    assert m.matmul_rate("fp32", 250, 250, 250) == 2e10  # the nearest measured shape
    assert m.matmul_rate("fp32", 500, 500, 500) == 8e10
    study = {"name": "s", "models": {"m": dict(MODEL)}, "series": [
        {"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2},
        {"name": "t", "mode": "weak", "model": "m", "gpus": [2], "tp": 2, "micro_batch": 2}]}
    from scalestudy.config.study import validate

    shapes = compute.gemm_shapes(plan_points(validate(study)))
    h, f, s, V = 256, 1024, 128, 1000
    assert (2 * s, h, h) in shapes and (2 * s, f, h) in shapes and (2 * s, V, h) in shapes
    assert (2 * s, h // 2, h) in shapes and (2 * s, V // 2, h) in shapes  # per TP rank
    assert (s, s, h // 8) in shapes and len(shapes) == len(set(shapes))


def test_cpu_host_shares_cores_and_does_not_overlap():
    """On a CPU host (compute_units declared) gloo's transfers use the computing cores: no
    DP overlap, and with more processes than cores every phase is that much slower."""
    cpu = ideal_hw(compute_units=2, devices_per_node=8)
    r2 = predict_step_time(point(dp=2, mb=2), cpu)
    assert r2.dp_overlap == 0.0
    assert r2.step_time_s == pytest.approx(r2.compute_s + r2.dp_comm_s)
    r4 = predict_step_time(point(dp=4, mb=2), cpu)
    assert r4.core_sharing_slowdown == 2.0
    unshared = predict_step_time(point(dp=4, mb=2), ideal_hw(devices_per_node=8))
    assert unshared.dp_overlap == 1.0 and unshared.dp_comm_exposed_s == 0.0
    assert r4.step_time_s == pytest.approx(2 * (unshared.compute_s + unshared.dp_comm_s))


def test_tensor_parallel_uses_dtensor_overhead():
    ovh = {"fwd_bwd_fixed_s": 1e-3, "fwd_bwd_per_layer_s": 1e-4, "optimizer_fixed_s": 0.0,
           "tp_fwd_bwd_fixed_s": 5e-3, "tp_fwd_bwd_per_layer_s": 1e-3, "optimizer_per_layer_s": 0.0}
    hw = ideal_hw(overhead=ovh)
    assert predict_step_time(point(mb=2, m=2), hw).overhead_s == pytest.approx(2 * (1e-3 + 8e-4))
    assert predict_step_time(point(tp=2, mb=2, m=2), hw).overhead_s == pytest.approx(2 * (5e-3 + 8e-3))
