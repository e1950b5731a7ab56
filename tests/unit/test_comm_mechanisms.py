"""The communication mechanisms scaling series need, each by hand: the
collective library's ring latency growing with the ranks and the nodes (NCCL's tuning model),
the data-parallel reduction in the framework's width and buckets, FSDP per block with its
prefetch; and the CPU host's side of the model unchanged to the last bit."""

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.perf import hardware, terms_comm as comm
from scalestudy.perf.hardware import CollectiveLatency, HardwareSpec, Link, ring_steps
from scalestudy.perf.framework import Framework
from scalestudy.perf.rates import Measured, collective_time
from scalestudy.perf.stepmodel import predict_step_time

NCCL = CollectiveLatency(8.4e-6, 3.4e-6, 14.0e-6, 8.4e-6, 4.0e-6, 14.0e-6)
TINY = dict(name="tiny", vocab=256, seq_len=64, layers=4, hidden=64, heads=4)


def gpu(fw=Framework(), library=NCCL, **kw):
    d = dict(name="g", device="g", devices_per_node=8, peak_flops={"bf16": 1e12, "fp32": 1e12},
             memory_bytes=1e12, mem_bw=1e30, matmul_efficiency=1.0,
             intra=Link(1e10, 5e-6, None, library), inter=Link(1e9, 1e-5, None, library),
             framework=fw)
    d.update(kw)
    return HardwareSpec(**d)


def point(model=TINY, **kw):
    base = dict(micro_batch=2, activation_checkpointing="none", precision="bf16")
    return Point.for_layout(Model(**model), **{**base, **kw})


# --- the ring latency (NVIDIA/nccl src/graph/tuning.cc) -----------------------------------------


def test_ring_steps_and_latency_by_hand():
    assert [ring_steps("all_reduce", p) for p in (1, 2, 8)] == [0, 2, 14]
    assert [ring_steps("all_gather", p) for p in (1, 2, 8)] == [0, 1, 7]
    with pytest.raises(ValueError, match="ring"):
        ring_steps("send_recv", 2)
    # 8 ranks on one node: base + 14 NVLink steps; 128 ranks on 16 nodes: 30 of the 254 steps
    # cross nodes (2 (nodes - 1)), the others stay on NVLink
    assert NCCL.ring("all_reduce", 8) == pytest.approx(8.4e-6 + 14 * 3.4e-6)
    assert NCCL.ring("all_reduce", 128, 16) == pytest.approx(8.4e-6 + 224 * 3.4e-6 + 30 * 14e-6)
    assert NCCL.ring("reduce_scatter", 128, 16) == pytest.approx(8.4e-6 + 112 * 3.4e-6 + 15 * 14e-6)
    assert NCCL.ring("all_gather", 4, 9) == NCCL.ring("all_gather", 4, 4)  # a node per rank at most
    # tree: up and down a chain of 8 per node and log2(16) levels
    assert NCCL.tree_all_reduce(128, 16) == pytest.approx(8.4e-6 + 2 * (7 * 4e-6 + 4 * 14e-6))
    assert NCCL.scalar_all_reduce(8) == NCCL.ring("all_reduce", 8)  # one node: the ring
    assert NCCL.scalar_all_reduce(8192, 1024) == NCCL.tree_all_reduce(8192, 1024)


def test_collective_time_uses_the_library_on_gpu_links_only():
    lib, plain = Link(1e10, 5e-6, None, NCCL), Link(1e10, 5e-6)
    n = 1e6
    assert collective_time("all_reduce", n, 8, lib) == pytest.approx(
        8.4e-6 + 14 * 3.4e-6 + 1.75 * n / 1e10)
    assert collective_time("all_gather", n, 16, lib, nodes=2) == pytest.approx(
        8.4e-6 + 14 * 3.4e-6 + 14e-6 + 15 / 16 * n / 1e10)
    # a send/recv keeps the link's latency; a link without a library (a CPU host, a measured
    # spec) keeps one latency per call at any size of group
    assert collective_time("send_recv", n, 2, lib) == pytest.approx(5e-6 + n / 1e10)
    assert collective_time("all_reduce", n, 8, plain) == pytest.approx(5e-6 + 1.75 * n / 1e10)
    # the scaled inter-node link keeps its library
    assert lib.scaled(2e10).library is NCCL


def test_the_presets_name_their_library():
    h = HardwareSpec.load("dgx-h100")
    assert h.intra.library == h.inter.library
    assert (h.intra.library.base_s, h.intra.library.intra_step_s,
            h.intra.library.inter_step_s) == (8.4e-6, 3.4e-6, 14.0e-6)
    fr = HardwareSpec.load("frontier").intra.library  # RCCL
    assert (fr.base_s, fr.intra_step_s, fr.inter_step_s) == (17.0e-6, 3.6e-6, 15.1e-6)
    assert HardwareSpec.load("cpu-local").intra.library is None  # gloo: its measured latency
    with pytest.raises(ValueError, match="collectives"):
        hardware.collective_latency({"collectives": "mpi", "intra_node": {"type": "nvlink"}}, "x")
    with pytest.raises(ValueError, match="link type"):
        hardware.collective_latency({"collectives": "nccl", "intra_node": {"type": "pigeon"}}, "x")


def test_tp_latency_grows_with_the_group_on_a_gpu():
    """A TP all-reduce of a tiny activation is all latency: 2 (p - 1) NVLink steps."""
    hw = gpu()
    t2 = comm.tp_collective_seconds(8.0, 2, hw)
    t8 = comm.tp_collective_seconds(8.0, 8, hw)
    assert t2 == pytest.approx(8.4e-6 + 2 * 3.4e-6 + 8 / 1e10)
    assert t8 - t2 == pytest.approx(12 * 3.4e-6 + 0.75 * 8 / 1e10)


# --- data-parallel reduction: width and buckets -------------------------------------------------


def test_dp_widths_and_buckets_by_hand():
    fp32_reduce = Framework(grad_reduce_bytes=4)
    assert comm.dp_widths(point(dp=4), gpu(fp32_reduce)) == (4, 2)
    assert comm.dp_widths(point(dp=4), gpu()) == (2, 2)  # the training precision's width
    assert comm.dp_widths(point(dp=4, precision="fp32"), gpu(Framework(grad_reduce_bytes=2))) == (4, 4)
    assert comm.dp_widths(point(dp=4), gpu(fp32_reduce, compute_units=2)) == (2, 2)  # CPU: frozen
    ddp = Framework(grad_reduce_bytes=4, dp_bucket_params=1e6)
    assert comm.dp_buckets(point(dp=4), 2.5e6, gpu(ddp)) == 3
    assert comm.dp_buckets(point(dp=4), 2.5e6, gpu()) == 1
    assert comm.dp_buckets(point(dp=4), 2.5e6, gpu(ddp, compute_units=2)) == 1
    mcore = Framework(dp_bucket_params=4e7, dp_bucket_params_per_rank=1e6)
    assert comm.dp_buckets(point(dp=64), 1e9, gpu(mcore)) == 16  # max(4e7, 6.4e7) per bucket
    # each bucket one all-reduce: the latency k times, the bytes once
    P = 2.5e6
    t, _, _ = comm.dp_comm_seconds(point(dp=4), P, gpu(ddp))
    lat = 8.4e-6 + 6 * 3.4e-6
    assert t == pytest.approx(3 * lat + 1.5 * 4 * P / 1e10)
    z1 = comm.dp_comm_seconds(point(dp=4, dp_mode="zero1"), P, gpu(ddp))[0]
    assert z1 == pytest.approx(6 * (8.4e-6 + 3 * 3.4e-6) + 0.75 * (4 + 2) * P / 1e10)


def test_dp_ring_across_nodes():
    hw = gpu()
    link, nodes, meas, name = comm.dp_ring(point(dp=16, tp=2), hw, Measured())
    # 4 members of each DP group per node: 4 nodes, 4 x the per-device NIC share, no fits
    assert (nodes, meas, name, link.bandwidth) == (4, None, "inter", 4e9)
    assert comm.dp_ring(point(dp=4, tp=2), hw)[1:] == (1, None, "intra")


def test_megatron_v1_ddp_implementations_in_the_step():
    """Megatron-LM v1's local DDP all-reduces after the backward: all of the reduction is
    exposed; its torch DDP reduces each bucket during the backward: none is when the backward
    is longer. Every other term is the same."""
    v100 = HardwareSpec.load("dgx2h-v100")
    p = point(dict(TINY, hidden=512, heads=8), dp=64, micro_batch=8, global_batch=512,
              activation_checkpointing="full")
    local = predict_step_time(p, v100.with_framework("megatron-lm-2019"))
    torch_ddp = predict_step_time(p, v100.with_framework("megatron-lm-2019-torch-ddp"))
    assert local.dp_comm_exposed_s == pytest.approx(local.dp_comm_s) and local.dp_comm_s > 0
    assert torch_ddp.dp_comm_exposed_s == 0.0
    assert local.dp_comm_s - torch_ddp.dp_comm_s == pytest.approx(0.0, abs=1e-3 * local.dp_comm_s)
    assert local.step_time_s - torch_ddp.step_time_s == pytest.approx(local.dp_comm_exposed_s)


# --- FSDP per block ------------------------------------------------------------------------------


def test_fsdp_per_block_schedule_by_hand():
    """L = 4 blocks; forward: root + first block gathered exposed, three prefetched; backward:
    root gathered again, blocks 3..1 prefetched (block 4 kept), reduce-scatters under the next
    block's backward, block 1's and the root's exposed."""
    hw = gpu(Framework(grad_reduce_bytes=4, fsdp_sync_every_micro_batch=True))
    p = point(dp=4, dp_mode="fsdp")
    B, R = 1e6, 3e5
    lat = 8.4e-6 + 3 * 3.4e-6
    ag, rs = lat + 0.75 * 2 * B / 1e10, lat + 0.75 * 4 * B / 1e10
    ag0, rs0 = lat + 0.75 * 2 * R / 1e10, lat + 0.75 * 4 * R / 1e10
    # compute long enough to hide every per-block collective
    traffic, exposed, link = comm.fsdp_layer_seconds(p, hw, 4, B, R, 1.0, 2.0, 1.0)
    assert link == "intra"
    assert traffic == pytest.approx(2 * ag0 + 4 * ag + 3 * ag + 4 * rs + rs0)
    assert exposed == pytest.approx(ag0 + ag + ag0 + rs + rs0)
    # no compute to hide behind: everything exposed
    t0, e0, _ = comm.fsdp_layer_seconds(p, hw, 4, B, R, 0.0, 0.0, 1.0)
    assert e0 == pytest.approx(t0)
    # a short window: each block exposes what its compute does not cover
    f, b = 0.5 * ag, 0.5 * (ag + rs)
    _, e, _ = comm.fsdp_layer_seconds(p, hw, 4, B, R, f, b, 1.0)
    bwd_slots = max(0.0, ag - b) + 2 * (ag + rs - b) + max(0.0, rs - b)
    assert e == pytest.approx(ag0 + ag + 3 * (ag - f) + ag0 + bwd_slots + rs + rs0)
    # zero-2 keeps the gathered parameters: no backward gathers
    t2, e2, _ = comm.fsdp_layer_seconds(point(dp=4, dp_mode="fsdp_grad_op"), hw, 4, B, R,
                                        1.0, 2.0, 1.0)
    assert (t2, e2) == pytest.approx((ag0 + 4 * ag + 4 * rs + rs0, ag0 + ag + rs + rs0))


def test_fsdp_micro_batches_and_pipeline_by_hand():
    B, R = 1e6, 0.0
    lat = 8.4e-6 + 3 * 3.4e-6
    ag, rs = lat + 0.75 * 2 * B / 1e10, lat + 0.75 * 2 * B / 1e10
    once = gpu()  # the sync waits for the last micro-batch
    _, e, _ = comm.fsdp_layer_seconds(point(dp=4, dp_mode="fsdp", grad_accum=3), once, 2, B, R,
                                      1.0, 2.0, 1.0)
    # each micro-batch exposes its first block's gather (block 2 is prefetched, block 1's
    # backward gather hides under block 2's backward); the last one its reduce-scatter too
    assert e == pytest.approx(3 * ag + rs)
    every = gpu(Framework(fsdp_sync_every_micro_batch=True))
    _, e, _ = comm.fsdp_layer_seconds(point(dp=4, dp_mode="fsdp", grad_accum=3), every, 2, B, R,
                                      1.0, 2.0, 1.0)
    assert e == pytest.approx(3 * (ag + rs))
    # under pipeline stages: gathered once per step, reduce-scattered after the last backward
    t, e, _ = comm.fsdp_layer_seconds(point(dp=4, pp=2, dp_mode="fsdp", grad_accum=4), every, 2,
                                      B, R, 1.0, 2.0, 1.0)
    assert (t, e) == pytest.approx((2 * ag + 2 * rs, ag + rs))
    assert comm.fsdp_layer_seconds(point(dp=1, dp_mode="fsdp"), every, 2, B, R, 1, 1, 1) == \
        (0.0, 0.0, "intra")


def test_fsdp_in_the_step_on_a_gpu_and_not_on_a_cpu_host():
    p = point(dp=4, dp_mode="fsdp", grad_accum=2)
    assert comm.fsdp_per_block(p, gpu()) and not comm.fsdp_per_block(p, gpu(compute_units=2))
    assert not comm.fsdp_per_block(point(dp=4), gpu())
    b = predict_step_time(p, gpu())
    assert b.step_time_s == pytest.approx(sum(b.terms().values()))
    assert 0.0 < b.dp_comm_exposed_s <= b.dp_comm_s
    # per-device throughput falls with N once the per-block collectives stop hiding
    slow = gpu(intra=Link(1e7, 5e-6, None, NCCL), inter=Link(1e6, 1e-5, None, NCCL))
    x4 = predict_step_time(point(dp=4, dp_mode="fsdp"), slow)
    x8 = predict_step_time(point(dp=8, dp_mode="fsdp"), slow)
    assert x8.dp_comm_exposed_s > x4.dp_comm_exposed_s


def test_clip_norm_all_reduce_takes_the_least_latency():
    p = point(tp=8, dp=16)  # 128 ranks on 16 nodes
    assert comm.clip_seconds(p, gpu()) == pytest.approx(NCCL.tree_all_reduce(128, 16))
    plain = gpu(library=None)
    assert comm.clip_seconds(p, plain) == pytest.approx(5e-6 + 2 * 127 / 128 * 4 / 1e10)


# --- the CPU host's side is frozen -------------------------------------------------------------


#: Step time and DP traffic of the cpu-local preset (torch framework) computed before this
#: change (commit 985c363): bf16, micro-batch 2, the tiny model; without measurements and with
#: measured collective fits. Bit for bit.
CPU_BEFORE = [
    (dict(dp=2), None, 0.22090911017060932, 0.003255022222222222),
    (dict(dp=2), "coll", 0.21963360794838713, 0.001979520000000001),
    (dict(dp=2, grad_accum=2, dp_mode="zero1"), None, 0.43266006211899644, 0.004755022222222223),
    (dict(dp=2, grad_accum=2, dp_mode="fsdp"), None, 0.44129261026714456, 0.011887555555555557),
    (dict(dp=2, grad_accum=2, dp_mode="fsdp"), "coll", 0.4416514532301075, 0.013346399999999998),
    (dict(dp=4, grad_accum=3, dp_mode="fsdp_grad_op"), None, 0.6515844791340502,
     0.011265066666666667),
    (dict(dp=2, tp=2, grad_accum=2, activation_checkpointing="full"), None, 0.4521459553930705,
     0.0023988444444444446),
    (dict(dp=2, pp=2, grad_accum=4, dp_mode="zero1"), "coll", 0.5615940077591397,
     0.003008959999999999),
    (dict(dp=4, tp=2, dp_mode="fsdp"), None, 0.1981342819297491, 0.006522399999999999),
]


def cpu_collectives() -> Measured:
    rows = [{"op": "all_reduce", "group_size": g, "bytes": n, "sample": 0,
             "seconds": 2e-4 * g + n / 3e8} for g in (2, 4) for n in (1e3, 1e5, 1e6)]
    rows += [{"op": op, "group_size": 2, "bytes": n, "sample": 0, "seconds": 3e-4 + n / 2e8}
             for op in ("all_gather", "reduce_scatter", "send_recv") for n in (1e3, 1e6)]
    return Measured.from_frames(None, rows)


@pytest.mark.parametrize("layout,meas,step,dp_comm", CPU_BEFORE)
def test_cpu_host_predictions_are_unchanged(layout, meas, step, dp_comm):
    hw = HardwareSpec.load("cpu-local")
    assert hw.framework.name == "torch" and hw.compute_units
    p = point(device="cpu", devices_per_node=2, **layout)
    b = predict_step_time(p, hw, cpu_collectives() if meas else None)
    # unchanged up to the last bit, which the host's floating-point library may round either
    # way (an interpolation in numpy: one host gives ...01, another ...02)
    assert float(b.step_time_s) == pytest.approx(step, rel=1e-12, abs=0)
    assert float(b.dp_comm_s) == pytest.approx(dp_comm, rel=1e-12, abs=0)
