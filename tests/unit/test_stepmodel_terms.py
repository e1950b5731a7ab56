"""The step model's terms one by one, each against a hand computation
(``scalestudy.perf.terms_compute``, ``terms_comm``, ``rates``, ``host``) and in the assembled
step (``stepmodel``).
No timing: every figure here is arithmetic on declared rates."""

import dataclasses
import math

import pytest

from scalestudy.config.parts import Model
from scalestudy.measure.memory import memory_point
from scalestudy.perf import host, rates, stepmodel
from scalestudy.perf import terms_comm as comm, terms_compute as compute
from scalestudy.perf.hardware import HardwareSpec, Link
from scalestudy.perf.assumption import Assumption
from scalestudy.perf.framework import Framework

MODEL = dict(vocab=1000, seq_len=128, layers=8, hidden=256, heads=8)


def hw_(**kw):
    d = dict(name="t", device="t", devices_per_node=8, peak_flops={"fp32": 1e12, "bf16": 2e12},
             memory_bytes=1e12, mem_bw=1e12, matmul_efficiency=0.5,
             intra=Link(1e10, 1e-5), inter=Link(1e9, 1e-4))
    d.update(kw)
    return HardwareSpec(**d)


def point(dp=1, tp=1, pp=1, mb=2, m=1, precision="fp32", **kw):
    return memory_point(dict(MODEL), mb, "none", dp=dp, tp=tp, pp=pp, grad_accum=m,
                        precision=precision, **kw)


# --- compute ----------------------------------------------------------------------------------


def test_tile_wave_efficiency_by_hand():
    assert rates.tile_wave_efficiency(1000, 1000, None, None) == 1.0  # no tile declared (CPU)
    # 300 x 128 on 256 x 128 tiles: 2 x 1 tiles of which 300/512 is used
    assert rates.tile_wave_efficiency(300, 128, (256, 128), None) == pytest.approx(300 / 512)
    # the cutlass issue's example: 210 tiles on 108 SMs take 2 waves = 216 slots
    assert rates.tile_wave_efficiency(210 * 128, 128, (128, 128), 108) == pytest.approx(210 / 216)
    # exactly one full wave: no loss
    assert rates.tile_wave_efficiency(108 * 256, 128, (256, 128), 108) == pytest.approx(1.0)


def test_gemm_efficiency_and_seconds_by_hand():
    hw = hw_(gemm_tile=(256, 128), multiprocessors=108, mem_bw=1e30)
    q = 210 / 216
    assert rates.gemm_efficiency(210 * 256, 128, 4096, hw) == pytest.approx(0.5 * q)
    half = hw_(gemm_tile=(256, 128), multiprocessors=108, mem_bw=1e30, gemm_quantisation=0.5)
    assert rates.gemm_efficiency(210 * 256, 128, 4096, half) == pytest.approx(0.5 * (1 - 0.5 * (1 - q)))
    # compute-bound: 2 M N K / (peak x efficiency), times count
    M, N, K = 210 * 256, 128, 4096
    assert rates.gemm_seconds(M, N, K, 3, "bf16", hw) == pytest.approx(3 * 2 * M * N * K / (2e12 * 0.5 * q))
    # memory-bound (roofline): a 4096 x 4096 x 1 product moves ~16.8M bf16 elements
    slow_mem = hw_(gemm_tile=(256, 128), multiprocessors=108, mem_bw=1e9, mem_bw_efficiency=0.5)
    nbytes = 2 * (4096 * 1 + 1 * 4096 + 4096 * 4096)
    assert rates.gemm_seconds(4096, 4096, 1, 1, "bf16", slow_mem) == pytest.approx(nbytes / 0.5e9)
    # without a declared tile (a CPU host) there is no roofline and no quantisation
    assert rates.gemm_seconds(4096, 4096, 1, 1, "fp32", hw_(mem_bw=1.0)) == pytest.approx(
        2 * 4096 * 4096 / 0.5e12)


def test_product_seconds_backward_shapes():
    hw = hw_(gemm_tile=(256, 128), multiprocessors=108, mem_bw=1e30)
    M, N, K = 4096, 128, 4096
    fwd, bwd, meas = rates.product_seconds(M, N, K, 1, "bf16", hw)
    assert not meas
    assert fwd == pytest.approx(rates.gemm_seconds(M, N, K, 1, "bf16", hw))
    # data gradient M x N . N x K and weight gradient K x M . M x N
    assert bwd == pytest.approx(rates.gemm_seconds(M, K, N, 1, "bf16", hw)
                                + rates.gemm_seconds(K, N, M, 1, "bf16", hw))
    # the thin forward (16 tiles on 108 SMs) is slower per FLOP than its backward products
    assert bwd < 2 * fwd
    m = rates.Measured(matmul={"bf16": [(4096, 4096, 4096, 1e12)]})
    fwd, bwd, meas = rates.product_seconds(M, N, K, 2, "bf16", hw, m)
    assert meas and fwd == pytest.approx(2 * 2 * M * N * K / 1e12) and bwd == pytest.approx(2 * fwd)


def test_layer_gemms_shapes_and_flops():
    cfg = Model(**MODEL)
    bs, h, f = 2 * 128, 256, 1024
    g = compute.layer_gemms(cfg, 128, 2, tp=2)
    assert g[:5] == [(bs, h / 2, h, 1), (bs, h / 2, h, 2), (bs, h, h / 2, 1), (bs, f / 2, h, 1),
                     (bs, h, f / 2, 1)]
    fused = compute.layer_gemms(cfg, 128, 2, tp=2, fused_qkv=True)
    assert fused[0] == (bs, 3 * h / 2, h, 1)
    from scalestudy.config import flops

    for gg in (g, fused):
        assert sum(2 * M * N * K * c for M, N, K, c in gg) * 2 == pytest.approx(
            flops.layer_forward_flops(cfg, 2))
    sw = Model(**MODEL, mlp="swiglu")
    assert compute.layer_gemms(sw, 128, 2, fused_qkv=True)[2] == (bs, 2 * sw.ffn, h, 1)
    assert compute.layer_gemms(sw, 128, 2)[3] == (bs, sw.ffn, h, 2)
    # grouped-query attention: k and v are kv_heads · head_dim wide, the sums still the FLOPs
    gqa = dataclasses.replace(cfg, arch="llama", kv_heads=cfg.heads // 2)
    kv = gqa.kv_dim
    assert kv == h // 2
    assert compute.layer_gemms(gqa, 128, 2, tp=2)[1] == (bs, kv / 2, h, 2)
    assert compute.layer_gemms(gqa, 128, 2, fused_qkv=True)[0] == (bs, h + 2 * kv, h, 1)
    for gg in (compute.layer_gemms(gqa, 128, 2, tp=2), compute.layer_gemms(gqa, 128, 2, tp=2, fused_qkv=True)):
        assert sum(2 * M * N * K * c for M, N, K, c in gg) * 2 == pytest.approx(
            flops.layer_forward_flops(gqa, 2))


def test_attention_seconds_flash_by_hand():
    cfg = Model(**MODEL)  # fused attention
    hw = hw_(attention_efficiency=0.25)
    fwd, bwd, meas = compute.attention_seconds(cfg, 128, 2, 2, "bf16", hw)
    flops_fwd = 0.5 * 4 * 2 * 128 * 128 * 256 / 2  # causal half, per TP rank
    assert not meas
    assert fwd == pytest.approx(flops_fwd / (0.25 * 2e12))
    assert bwd == pytest.approx(2.5 * fwd)
    # math attention (or no declared kernel): the two products at the GEMM rate, full s^2
    math_cfg = Model(**MODEL, attention="math")
    fwd, bwd, _ = compute.attention_seconds(math_cfg, 128, 2, 1, "bf16", hw)
    # plus the eager softmax over b*a score matrices of s x s (7 elements each way, 2 bytes)
    soft = 7 * 2 * 8 * 128 * 128 * 2 / 1e12
    assert fwd == pytest.approx(4 * 2 * 128 * 128 * 256 / (0.5 * 2e12) + soft)
    assert bwd == pytest.approx(2 * 4 * 2 * 128 * 128 * 256 / (0.5 * 2e12) + soft)
    # a measured fused-attention rate (Megatron's count 4 b s^2 h / tp)
    m = rates.Measured(attention={"bf16": [(128, 32, 1e11)]})
    fwd, bwd, meas = compute.attention_seconds(cfg, 128, 2, 1, "bf16", hw, m)
    assert meas and fwd == pytest.approx(4 * 2 * 128 * 128 * 256 / 1e11) and bwd == 2 * fwd


def test_elementwise_and_loss_by_hand():
    cfg = Model(**MODEL)
    h, f, s, b = 256, 1024, 128, 2
    # GPT: norms 4h, relayout 2h (per TP rank), residuals 6h, GELU 2f; backward twice that
    assert compute.elementwise_bytes(cfg, s, b, 2) == pytest.approx(3 * (12 * h + 2 * f) * s * b * 2)
    assert compute.elementwise_bytes(cfg, s, b, 2, tp=2) == pytest.approx(3 * (11 * h + f) * s * b * 2)
    assert compute.elementwise_bytes(cfg, s, b, 2, tp=2, sp=True) == pytest.approx(
        3 * (6 * h + f) * s * b * 2)
    sw = Model(**MODEL, mlp="swiglu")
    assert compute.elementwise_bytes(sw, s, b, 4) == pytest.approx(3 * (12 * h + 5 * sw.ffn) * s * b * 4)
    assert compute.elementwise_bytes(sw, s, b, 4, fusion="fused") == pytest.approx(
        3 * (12 * h + 3 * sw.ffn) * s * b * 4)
    # fp32 logits (or fused): 20 bytes per logit; eager over 16-bit logits 32
    assert compute.loss_bytes(s, b, 1000, 2) == pytest.approx(20 * b * s * 500)
    assert compute.loss_bytes(s, b, 1000, 2, "eager", 2) == pytest.approx(32 * b * s * 500)
    hw = hw_(mem_bw=2e12, mem_bw_efficiency=0.5)
    assert rates.elementwise_seconds(1e12, hw) == pytest.approx(1.0)
    assert rates.elementwise_seconds(1e12, hw, rates.Measured(mem_bw=4e12)) == pytest.approx(0.25)


# --- communication ----------------------------------------------------------------------------


def test_tp_collective_and_overlap_by_hand():
    hw = hw_()
    n = 1e6
    assert comm.tp_collective_seconds(n, 1, hw) == 0.0
    assert comm.tp_collective_seconds(n, 4, hw) == pytest.approx(1e-5 + 1.5 * n / 1e10)
    assert comm.tp_collective_seconds(n, 4, hw, sp=True) == pytest.approx(2 * (1e-5 + 0.75 * n / 1e10))
    fw = Framework(tp_overlap=0.5, tp_overlap_needs_sp=True)
    assert comm.tp_overlap(fw, sp=False) == 0.0 and comm.tp_overlap(fw, sp=True) == 0.5
    assert comm.tp_overlap(Framework(tp_overlap=0.5, tp_overlap_needs_sp=False), sp=False) == 0.5


def test_head_tp_exchange_gathers_or_reduces():
    """scalestudy's trainer gathers the logits before the loss; Megatron's vocabulary-parallel
    cross-entropy all-reduces three b*s fp32 vectors instead."""
    p = point(tp=2, mb=2)
    gather = stepmodel.predict_step_time(p, hw_(mem_bw=1e30))
    reduce = stepmodel.predict_step_time(p, hw_(mem_bw=1e30, framework=Framework(vocab_parallel_loss=True)))
    per = 1e-5 + 2 * 128 * 256 * 4 / 1e10
    logits = 1e-5 + 0.5 * 2 * 128 * 1000 * 4 / 1e10
    small = 3 * (1e-5 + 2 * 128 * 4 / 1e10)
    edges = per  # the embedding's all-reduce
    assert gather.tp_comm_s == pytest.approx(4 * 8 * per + edges + logits + per)
    assert reduce.tp_comm_s == pytest.approx(4 * 8 * per + edges + small + per)


def test_boundary_crosses_node():
    # tp 1, dp 2, pp 8 on 8 devices per node: stages 0-3 on node 0, 4-7 on node 1
    p = point(dp=2, pp=8, m=8)
    assert [comm.boundary_crosses_node(p, r, 8) for r in range(7)] == [False] * 3 + [True] + [False] * 3
    # tp 4 x dp 2 fills a node per stage: every boundary crosses
    q = point(dp=2, tp=4, pp=2, m=2)
    assert comm.boundary_crosses_node(q, 0, 8)


def test_p2p_seconds_by_hand():
    msg = 2 * 128 * 256 * 4  # fp32 b s h
    one = 1e-5 + msg / 1e10
    torch_fw = hw_()
    p = point(pp=4, m=4)
    # torch: 2 serial transfers per neighbour; the first stage has one neighbour
    assert comm.p2p_seconds(p, 0, torch_fw) == pytest.approx(2 * one)
    assert comm.p2p_seconds(p, 1, torch_fw) == pytest.approx(4 * one)
    assert comm.p2p_seconds(point(pp=1), 0, torch_fw) == 0.0
    # DeepSpeed-style partitioned transfers: 1/tp of the activation, plus an all-gather over TP
    ds = hw_(framework=Framework(name="ds", pp_transfers_per_neighbour=2, pp_partitioned=True))
    q = point(tp=2, pp=4, m=4)
    part = 1e-5 + (msg / 2) / 1e10
    gather = 1e-5 + 0.5 * msg / 1e10
    assert comm.p2p_seconds(q, 1, ds) == pytest.approx(2 * (2 * part + gather))
    # Megatron-Core: 1 transfer per neighbour, overlapped only with interleaving
    mc = hw_(framework=Framework(name="mc", pp_transfers_per_neighbour=1, pp_overlap=0.75))
    assert comm.p2p_seconds(p, 1, mc) == pytest.approx(2 * one)
    r = point(pp=4, m=8, pp_schedule="interleaved1f1b", virtual_stages=2)
    assert comm.p2p_seconds(r, 1, mc) == pytest.approx(2 * 2 * one * 0.25)
    # across nodes the inter-node link (1 devices per node here)
    assert comm.p2p_seconds(p, 0, hw_(devices_per_node=1)) == pytest.approx(2 * (1e-4 + msg / 1e9))


def test_pipeline_seconds_by_hand():
    assert comm.pipeline_seconds([1.0], 8) == (8.0, 0.0)
    # equal stages: (m + p - 1) slots, interleaving divides the bubble by v
    assert comm.pipeline_seconds([1.0] * 4, 8) == (11.0, 3.0)
    assert comm.pipeline_seconds([1.0] * 4, 8, virtual=3) == (9.0, 1.0)
    # unequal stages: m slots of the slowest + the others once each
    assert comm.pipeline_seconds([1.0, 1.0, 2.0], 10) == (22.0, 2.0)


def test_dp_comm_and_exposure_by_hand():
    hw = hw_()
    P = 1e6
    ddp = point(dp=4)
    t, t_mb, link = comm.dp_comm_seconds(ddp, P, hw)
    assert (t_mb, link) == (0.0, "intra") and t == pytest.approx(1e-5 + 1.5 * 4 * P / 1e10)
    z1 = point(dp=4, dp_mode="zero1")
    assert comm.dp_comm_seconds(z1, P, hw)[0] == pytest.approx(2 * (1e-5 + 0.75 * 4 * P / 1e10))
    fsdp = point(dp=4, dp_mode="fsdp")
    t, t_mb, _ = comm.dp_comm_seconds(fsdp, P, hw)
    assert t_mb == pytest.approx(2 * (1e-5 + 0.75 * 4 * P / 1e10))
    # bf16 gradients, across nodes (tp 4 x dp 4 > 8 per node): 2 members of each DP group
    # on a node share one exit of the ring, so each group gets 2 x the per-device NIC share
    x = point(dp=4, tp=4, precision="bf16")
    t, _, link = comm.dp_comm_seconds(x, P, hw)
    assert comm.dp_members_per_node(x, 8) == 2
    assert link == "inter" and t == pytest.approx(1e-4 + 1.5 * 2 * P / 2e9)
    assert comm.dp_comm_seconds(point(), P, hw) == (0.0, 0.0, "intra")
    # exposure: overlap x the last backward hides it; a chunk stays exposed when declared
    assert comm.dp_exposed_seconds(10.0, 0.0, 4, 1.0, 6.0, 9.0) == pytest.approx(4.0)
    assert comm.dp_exposed_seconds(10.0, 0.0, 4, 0.5, 6.0, 9.0) == pytest.approx(7.0)
    assert comm.dp_exposed_seconds(10.0, 0.0, 4, 1.0, 60.0, 9.0, chunks=5) == pytest.approx(2.0)
    assert comm.dp_exposed_seconds(10.0, 0.0, 4, 0.0, 60.0, 9.0, chunks=5) == pytest.approx(10.0)
    assert comm.dp_exposed_seconds(0.0, 2.0, 4, 1.0, 0.0, 1.5) == pytest.approx(4 * 0.5)


def test_zero1_all_reduce_and_fsdp_sync_every_micro_batch_by_hand():
    """DeepSpeed's BF16_Optimizer all-reduces the whole gradient (then all-gathers the
    parameters); FSDP2 left syncing reduce-scatters every micro-batch, but not under PP."""
    P = 1e6
    ar, ag = 1e-5 + 1.5 * 4 * P / 1e10, 1e-5 + 0.75 * 4 * P / 1e10
    z1 = point(dp=4, dp_mode="zero1")
    assert comm.dp_comm_seconds(z1, P, hw_(framework=Framework(zero1_all_reduce=True)))[0] == \
        pytest.approx(ar + ag)
    sync = hw_(framework=Framework(fsdp_sync_every_micro_batch=True))
    # 4 micro-batches: the last reduce-scatter is the step's, 3 more spread over the 4
    t, t_mb, _ = comm.dp_comm_seconds(point(dp=4, m=4, dp_mode="fsdp"), P, sync)
    assert t == pytest.approx(ag) and t_mb == pytest.approx(2 * ag + 3 / 4 * ag)
    assert comm.dp_comm_seconds(point(dp=4, m=1, dp_mode="fsdp"), P, sync)[1] == pytest.approx(2 * ag)
    t, t_mb, _ = comm.dp_comm_seconds(point(dp=4, pp=2, m=2, dp_mode="fsdp"), P, sync)
    assert t == pytest.approx(ag) and t_mb == pytest.approx(2 * ag)
    assert not comm.syncs_every_micro_batch(point(dp=4, dp_mode="zero1"), sync.framework)


def test_grad_accumulation_by_hand():
    """Bytes per parameter per micro-batch (first micro-batch, later ones) of each framework's
    gradient accumulation, and its seconds at memory bandwidth."""
    from scalestudy.perf import kernels

    assert kernels.grad_accumulation_bytes("autograd", 2) == (6.0, 0.0)  # grad += new
    assert kernels.grad_accumulation_bytes("autograd", 4) == (12.0, 0.0)
    assert kernels.grad_accumulation_bytes("hp_grad_copy", 2) == (18.0, 18.0)  # cast + add
    assert kernels.grad_accumulation_bytes("fsdp2", 2) == (10.0, 6.0)
    assert kernels.grad_accumulation_bytes("fused", 2) == (0.0, 0.0)
    with pytest.raises(ValueError, match="grad_accumulation"):
        kernels.grad_accumulation_bytes("magic", 2)
    assert [kernels.accumulated_grad_bytes(m, 2) for m in kernels.GRAD_ACCUMULATION] == [2, 4, 4, 2]
    hw = hw_(mem_bw=1e12, mem_bw_efficiency=0.5)
    assert compute.grad_accumulation_seconds(1e9, 4, "autograd", 2, hw) == pytest.approx(3 * 6e9 / 0.5e12)
    assert compute.grad_accumulation_seconds(1e9, 4, "hp_grad_copy", 2, hw) == pytest.approx(4 * 18e9 / 0.5e12)
    assert compute.grad_accumulation_seconds(1e9, 4, "fsdp2", 2, hw) == pytest.approx((6 + 3 * 10) * 1e9 / 0.5e12)
    assert compute.grad_accumulation_seconds(1e9, 1, "autograd", 2, hw) == 0.0
    assert compute.grad_accumulation_seconds(1e9, 4, "fused", 2, hw) == 0.0
    assert compute.grad_bytes_of(point(precision="bf16"), Framework()) == 2
    assert compute.grad_bytes_of(point(precision="bf16"), Framework(grad_bytes=4)) == 4


def test_grad_accumulation_in_the_step_by_hand():
    """Each stage's slot carries its gradient accumulation, m slots of the bottleneck's: the
    model of 8 GPT layers (12h^2 + 13h parameters each), learned positions, a final norm and
    an untied head, h = 256, V = 1000, s = 128."""
    h, V = 256, 1000
    P = 8 * (12 * h * h + 13 * h) + V * h + 128 * h + 2 * h + V * h
    hw = hw_(mem_bw=1e12, mem_bw_efficiency=0.5)
    b = stepmodel.predict_step_time(point(m=4, precision="bf16"), hw)  # autograd, bf16 gradients
    assert b.grad_accum_s == pytest.approx(3 * 6 * P / 0.5e12)
    assert b.step_time_s == pytest.approx(sum(b.terms().values()))
    fw = Framework(grad_accumulation="hp_grad_copy")
    c = stepmodel.predict_step_time(point(m=4, precision="bf16"), hw_(mem_bw=1e12, mem_bw_efficiency=0.5,
                                                               framework=fw))
    assert c.grad_accum_s == pytest.approx(4 * 18 * P / 0.5e12)
    assert c.micro_batch_slot_s - b.micro_batch_slot_s == pytest.approx((72 - 18) * P / 4 / 0.5e12)


def test_tied_embedding_gradient_all_reduce_by_hand():
    """The first and the last stage all-reduce the shared word embedding's gradient (2 ranks),
    across nodes when the stages are on different nodes, once per step."""
    fw = Framework(tied_grad_all_reduce=True)
    tied = dict(MODEL, tied_embeddings=True)

    def p(**kw):
        return memory_point(tied, 2, "none", precision="bf16", **kw)

    n = 1000 * 256 * 2  # vocab x hidden, bf16
    # tp 1 x dp 8 per stage: stage 0 on node 0, stage 1 on node 1: the inter-node link
    assert comm.tied_grad_seconds(p(dp=8, pp=2, grad_accum=2), hw_(framework=fw), 2) == \
        pytest.approx(1e-4 + n / 1e9)
    # dp 2: both stages on one node; fp32 gradients (BF16_Optimizer's) are twice the bytes
    assert comm.tied_grad_seconds(p(dp=2, pp=2, grad_accum=2), hw_(framework=fw), 4) == \
        pytest.approx(1e-5 + 2 * n / 1e10)
    assert comm.tied_grad_seconds(p(dp=8, pp=2, grad_accum=2), hw_(), 2) == 0.0  # torch: none
    assert comm.tied_grad_seconds(p(dp=8), hw_(framework=fw), 2) == 0.0  # one stage
    b = stepmodel.predict_step_time(p(dp=8, pp=2, grad_accum=2), hw_(framework=fw, mem_bw=1e30))
    nodp = stepmodel.predict_step_time(p(dp=8, pp=2, grad_accum=2),
                                hw_(framework=Framework(), mem_bw=1e30))
    assert b.dp_comm_exposed_s - nodp.dp_comm_exposed_s == pytest.approx(1e-4 + n / 1e9)


def test_dp_overlap_fraction_rules():
    fw = Framework(dp_overlap=0.9, dp_overlap_pp=0.3)
    hw = hw_(framework=fw)
    assert comm.dp_overlap_fraction(point(dp=2), hw) == 0.9
    assert comm.dp_overlap_fraction(point(dp=2, pp=2, m=2), hw) == 0.3
    assert comm.dp_overlap_fraction(point(dp=2), hw, override=0.1) == 0.1
    assert comm.dp_overlap_fraction(point(dp=2), hw_(compute_units=2, framework=fw)) == 0.0


def test_optimizer_overhead_slowdown_by_hand():
    hw = hw_(mem_bw=1e12, mem_bw_efficiency=0.5)
    assert compute.optimizer_seconds(1e9, hw) == pytest.approx(28 * 1e9 / 0.5e12)
    assert compute.optimizer_seconds(1e9, hw, 0.1, 0.2) == pytest.approx(28 * 1e9 / 0.5e12 + 0.3)
    ovh = {"fwd_bwd_fixed_s": 1.0, "fwd_bwd_per_layer_s": 0.5,
           "tp_fwd_bwd_fixed_s": 3.0, "tp_fwd_bwd_per_layer_s": 2.0}
    assert compute.overhead_seconds(ovh, "fwd_bwd", 4, 1) == pytest.approx(3.0)
    assert compute.overhead_seconds(ovh, "fwd_bwd", 4, 2) == pytest.approx(11.0)
    assert compute.overhead_seconds(ovh, "optimizer", 4, 1) == 0.0
    assert host.core_sharing_slowdown(point(dp=4), hw_(compute_units=2)) == 2.0
    assert host.core_sharing_slowdown(point(dp=2), hw_(compute_units=2)) == 1.0
    assert host.core_sharing_slowdown(point(dp=4), hw_()) == 1.0


def test_host_round_trips_by_hand():
    """A framework's per-tensor checks that read a value back (``tensor_syncs``) and its
    synchronous copies of the CUDA generator state (``rng_state_*``), each priced at the
    system's ``host_sync_s`` (+ ``kernel_gap_s`` per launch, + the bytes over the host link),
    and where they land in the step: the optimizer and each micro-batch's slot."""
    from scalestudy.perf import memory

    fw = Framework(tensor_syncs=2, tensor_sync_launches=3, rng_state_bytes=824000,
                   rng_state_copies=4, rng_state_copies_checkpointed=8)
    hw = hw_(framework=fw, host_sync_s=10e-6, kernel_gap_s=2e-6, host_bandwidth=8e9, mem_bw=1e30)
    assert compute.tensor_sync_seconds(100, hw) == pytest.approx(100 * (2 * 10e-6 + 3 * 2e-6))
    copy = 10e-6 + 824000 / 8e9
    assert compute.rng_state_seconds(8, 0, hw) == pytest.approx(32 * copy)
    assert compute.rng_state_seconds(8, 8, hw) == pytest.approx(96 * copy)
    assert compute.rng_state_seconds(8, 8, hw_(framework=fw, host_sync_s=10e-6)) == \
        pytest.approx(96 * 10e-6)  # no host link declared: the round trips alone
    plain = hw_(host_sync_s=10e-6, kernel_gap_s=2e-6, host_bandwidth=8e9, mem_bw=1e30)
    assert compute.tensor_sync_seconds(100, plain) == compute.rng_state_seconds(8, 8, plain) == 0.0
    # in the step: 8 GPT layers, 2 micro-batches, no recompute
    p = point(m=2)
    a, b = stepmodel.predict_step_time(p, plain), stepmodel.predict_step_time(p, hw)
    tensors = memory.stage_param_tensors(p.model, 1, 0)
    assert b.optimizer_s - a.optimizer_s == pytest.approx(tensors * (2 * 10e-6 + 3 * 2e-6))
    assert b.overhead_s - a.overhead_s == pytest.approx(2 * 32 * copy)
    assert b.step_time_s == pytest.approx(sum(b.terms().values()))


# --- the whole step ---------------------------------------------------------------------------


def test_breakdown_terms_add_up():
    hw = hw_(mem_bw=1e30)
    b = stepmodel.predict_step_time(point(mb=2), hw)
    assert b.step_time_s == pytest.approx(sum(b.terms().values()))
    assert sum(b.fractions().values()) == pytest.approx(1.0)
    assert b.compute_s == pytest.approx(b.gemm_s + b.attention_s + b.elementwise_s)
    row = b.row()
    assert row["compute_s"] == b.compute_s and row["framework"] == "torch"


def test_assumptions_and_scenarios():
    a = Assumption.parse({"value": 0.5, "low": 0.4, "high": 0.8, "source": "x"})
    assert (a.value, a.low, a.high, a.source, a.end("slow"), a.end("fast")) == (0.5, 0.4, 0.8, "x", 0.4, 0.8)
    cost = Assumption.parse({"value": 1, "low": 0, "high": 1}, slow="high")
    assert cost.end("slow") == 1 and cost.end("fast") == 0
    assert Assumption.parse(3.0) == Assumption(3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="outside its range"):
        Assumption(1.0, 0.0, 0.5)
    fr = HardwareSpec.load("frontier")
    varied = [k for k, v in fr.assumptions.items() if v.low != v.high]
    sc = dict(fr.scenarios())
    assert len(sc) == 3 + 2 * len(varied)
    assert sc["all slow"].matmul_efficiency == 0.663 and sc["all fast"].matmul_efficiency == 0.767
    assert sc["inter_bandwidth low"].inter.bandwidth == 10e9
    assert sc["intra_bandwidth high"].intra.bw(4) == 100e9
    assert sc["intra_bandwidth high"].intra.bw(2) == 400e9  # the pair scales with it
    assert sc["gemm_quantisation low"].gemm_quantisation == 0.0
    # the range of a prediction is the envelope of these scenarios
    from scalestudy.validation import frontier

    row = frontier.reference("frontier_dash2024_configs").iloc[3]
    p = frontier.config_point(row, 2, 640)
    pr = stepmodel.predict_range(p, fr)
    assert pr.step_time_low_s <= pr.central.step_time_s <= pr.step_time_high_s
    assert pr.step_time_low_s < pr.step_time_high_s


def test_dgx_presets_cite_their_figures():
    h = HardwareSpec.load("dgx-h100")
    assert (h.devices_per_node, h.peak("bf16"), h.framework.name) == (8, 989e12, "megatron-core")
    assert h.intra.bandwidth == 370e9 and h.inter.bandwidth == 46e9
    assert h.multiprocessors == 132 and h.gemm_tile == (256, 128)
    a = HardwareSpec.load("dgx-a100")
    assert (a.devices_per_node, a.peak("bf16"), a.inter.bandwidth) == (8, 312e12, 24e9)
    assert a.multiprocessors == 108
    for hw in (h, a, HardwareSpec.load("frontier")):
        for name, ass in hw.assumptions.items():
            assert ass.low <= ass.value <= ass.high, name
    # the framework can be swapped (scalestudy predict --framework)
    assert h.with_framework("megatron-deepspeed").framework.pp_partitioned
    assert math.isclose(h.with_framework("torch").assumptions["dp_overlap"].value, 1.0)


def test_distributed_optimizer_gather_hides_under_the_next_forward():
    """Megatron-Core's --overlap-param-gather: zero1's parameter all-gather (half its per-step
    traffic) runs under the first forward of the next step, not only after the backward."""
    fw = dict(dp_overlap=1.0, dp_overlap_pp=1.0, dp_exposes_one_chunk=False)
    p = point(dp=4, dp_mode="zero1", mb=2)
    slow = hw_(mem_bw=1e30, intra=Link(1e8, 1e-5), framework=Framework(**fw))
    hidden = hw_(mem_bw=1e30, intra=Link(1e8, 1e-5), framework=Framework(**fw, dp_gather_overlap=True))
    a, b = stepmodel.predict_step_time(p, slow), stepmodel.predict_step_time(p, hidden)
    t_comp = a.gemm_s + a.attention_s + a.elementwise_s
    assert a.dp_comm_exposed_s == pytest.approx(max(0.0, a.dp_comm_s - t_comp * 2 / 3))
    assert b.dp_comm_exposed_s == pytest.approx(
        max(0.0, a.dp_comm_s / 2 - t_comp * 2 / 3) + max(0.0, a.dp_comm_s / 2 - t_comp / 3))
    assert b.dp_comm_exposed_s < a.dp_comm_exposed_s
