"""The performance model on a CPU host: blocks of the study's own model
measured by the calibrate job, composed into each point's step; the measured cost of sharing
the cores; the larger points predicted before they run from the model calibrated on the
smaller ones. Every check is arithmetic done by hand: no timing is asserted here (the
predicted/measured figures are ``make bench``'s, benchmarks/predict.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from scalestudy.config.study import load_study, validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.perf import hardware, host, memory, rates, stepmodel, terms_comm as comm
from scalestudy.report import before_run, predict
from scalestudy.perf.host import (composed_optimizer_seconds, composed_stage_seconds,
                                  core_sharing_slowdown, oversubscribed, sharing_factor,
                                  split_measured_slot)
from scalestudy.perf.rates import (Measured, block_key, block_layout, block_layout_tp,
                                   blocks_from_rows, core_sharing_from_rows)
from scalestudy.plan.planner import plan_points
from scalestudy import cli

DEFAULT = "workflow/config/default.yaml"


@pytest.fixture(scope="module")
def points():
    """The default study's feasible points by (series, n)."""
    return {(p.series, p.n): p for p in plan_points(load_study(DEFAULT)) if p.feasible}


@pytest.fixture(scope="module")
def hw():
    return hardware.HardwareSpec.load("cpu-local")


# --- pure terms ------------------------------------------------------------------------------


def test_sharing_factor_interpolates_the_measured_slowdown():
    assert sharing_factor(4, {}, 2) == 2.0 and sharing_factor(1, {}, 2) == 1.0  # procs/cores
    f = {1: 1.0, 2: 1.2, 4: 2.6}
    assert sharing_factor(2, f, 2) == 1.2
    assert sharing_factor(3, f, 2) == pytest.approx(1.2 + 0.5 * 1.4)  # halfway 2 -> 4
    assert sharing_factor(8, f, 2) == pytest.approx(2.6 * 8 / 4)  # beyond: cores shared more
    assert sharing_factor(1, {2: 1.3}, 2) == 1.3  # below the smallest measured count


def test_core_sharing_slowdown_and_oversubscription(points, hw):
    p1, p4 = points[("weak-dp", 1)], points[("weak-dp", 4)]
    m = Measured(core_sharing={1: 1.0, 2: 1.1, 4: 2.5})
    assert core_sharing_slowdown(p4, hw) == 2.0  # 4 processes, 2 cores, nothing measured
    assert core_sharing_slowdown(p4, hw, m) == 2.5 and core_sharing_slowdown(p1, hw, m) == 1.0
    assert oversubscribed(p4, hw) and not oversubscribed(points[("weak-dp", 2)], hw)
    gpu = hardware.HardwareSpec.load("dgx-a100")
    assert core_sharing_slowdown(p4, gpu, m) == 1.0 and not oversubscribed(p4, gpu)


def test_composed_stage_and_optimizer_seconds_by_hand():
    # whole micro-batch 10 ms of 2 layers (3 ms each), embedding 1, head 2
    assert composed_stage_seconds(10, 3, 1, 2, 2, 2, True, True) == 10  # one stage: itself
    assert composed_stage_seconds(10, 3, 1, 2, 2, 1, True, False) == pytest.approx(10 - 3 - 2)
    assert composed_stage_seconds(10, 3, 1, 2, 2, 1, False, True) == pytest.approx(10 - 3 - 1)
    assert composed_stage_seconds(10, 3, 1, 2, 2, 2, True, True, 2) == pytest.approx(12)
    assert composed_stage_seconds(4, 3, 1, 2, 2, 1, True, False) == 3  # never below its layers
    assert composed_optimizer_seconds(5, 2, 2, 1) == 3
    assert composed_optimizer_seconds(2, 1.5, 2, 1) == 1.5


def test_in_step_optimizer_is_the_step_block_less_its_micro_batch():
    blk = {"fwd_bwd_s": 8e-3, "optimizer_s": 1.5e-3, "optimizer_layer_s": 6e-4}
    # measured without a step block (an older calibration.json): the isolated optimizer
    assert host.in_step_optimizer(blk) == (1.5e-3, 6e-4)
    # a step of 10.4 ms = its 8 ms micro-batch + 2.4 ms of optimizer after a backward:
    # 1.6x the isolated block, one layer's share alike (0.96 ms)
    whole, layer = host.in_step_optimizer({**blk, "step_s": 10.4e-3})
    assert whole == pytest.approx(2.4e-3) and layer == pytest.approx(6e-4 * 1.6)
    # a step measured faster than its micro-batch (noise) gives no negative time
    assert host.in_step_optimizer({**blk, "step_s": 7e-3}) == (0.0, 0.0)


def test_the_in_step_optimizer_is_paired_by_round():
    # three rounds, the host 2x slower in round 1 and the step slow in round 2: the step less
    # its micro-batch of the same round is 2, 2, 11 ms (median 2 ms); the medians' difference
    # would say 18 - 9 = 9 ms
    fb, st = (8e-3, 16e-3, 9e-3), (10e-3, 18e-3, 20e-3)
    rows = [{"key": "k", "block": b, "sample": i, "seconds": s}
            for b, xs in (("fwd_bwd", fb), ("step", st)) for i, s in enumerate(xs)]
    rows += [{"key": "k", "block": b, "sample": 0, "seconds": s}
             for b, s in (("optimizer", 1e-3), ("optimizer_layer", 4e-4))]
    blk = blocks_from_rows(rows)["k"]
    assert blk["step_optimizer_s"] == pytest.approx(2e-3)
    assert blk["step_s"] - blk["fwd_bwd_s"] == pytest.approx(9e-3)
    assert host.in_step_optimizer(blk) == pytest.approx((2e-3, 8e-4))
    rows[3]["seconds"] = 5e-3  # a step faster than its micro-batch (noise): never negative
    assert blocks_from_rows(rows)["k"]["step_optimizer_s"] >= 0.0
    # rows without their round (an older record): medians, and the medians' difference
    bare = blocks_from_rows([{k: v for k, v in r.items() if k != "sample"} for r in rows])["k"]
    assert "step_optimizer_s" not in bare and bare["fwd_bwd_s"] == pytest.approx(9e-3)


def test_ddp_wrapper_costs_are_paired_by_round_and_averaged_over_the_step(points):
    # DDP's micro-batch less the plain one of the same round: 0.3, 0.4, 0.2 ms inside
    # no_sync (median 0.3), 1.0, 1.6, 1.2 ms with the sync (median 1.2)
    fb = (8e-3, 16e-3, 9e-3)
    rows = [{"key": "k", "block": b, "sample": i, "seconds": s}
            for b, xs in (("fwd_bwd", fb),
                          ("ddp_fwd_bwd", (8.3e-3, 16.4e-3, 9.2e-3)),
                          ("ddp_sync_fwd_bwd", (9e-3, 17.6e-3, 10.2e-3)))
            for i, s in enumerate(xs)]
    blk = blocks_from_rows(rows)["k"]
    assert blk["ddp_micro_batch_s"] == pytest.approx(3e-4)
    assert blk["ddp_sync_s"] == pytest.approx(1.2e-3)
    # strong-dp N=2: 4 micro-batches, 3 inside no_sync and the last synced
    wrap = host.ddp_wrapper_seconds
    assert wrap(points[("strong-dp", 2)], blk) == pytest.approx((3 * 3e-4 + 1.2e-3) / 4)
    assert wrap(points[("weak-dp", 2)], blk) == pytest.approx(1.2e-3)  # one, synced
    # no DDP: one rank, or FSDP2's replicate (with TP or PP); nothing measured
    for key in (("weak-dp", 1), ("weak-tp", 4), ("strong-pp", 4)):
        assert wrap(points[key], blk) == 0.0
    assert wrap(points[("weak-dp", 2)], {"fwd_bwd_s": 8e-3}) == 0.0


def test_block_layouts_name_the_tensor_parallel_degree(points):
    assert block_layout(points[("weak-dp", 2)]) == "plain"
    assert block_layout(points[("weak-tp", 2)]) == block_layout(points[("weak-tp", 4)]) == "tp2"
    assert [block_layout_tp(x) for x in ("plain", "tp2", "tp16")] == [1, 2, 16]
    for bad in ("tp", "tp1", "tp02", "TP2", "fsdp"):
        with pytest.raises(ValueError, match="use plain or tp<degree>"):
            block_layout_tp(bad)


def test_split_measured_slot():
    (g, a, e), o = split_measured_slot(10.0, (2.0, 1.0, 1.0))
    assert (g, a, e, o) == (2.0, 1.0, 1.0, 6.0)
    (g, a, e), o = split_measured_slot(2.0, (2.0, 1.0, 1.0))
    assert (g, a, e) == pytest.approx((1.0, 0.5, 0.5)) and o == 0.0


def test_blocks_and_core_sharing_from_rows_take_medians():
    rows = [{"key": "k", "block": b, "sample": i, "seconds": s * (1 + i)}
            for b, s in (("fwd_bwd", 1e-3), ("layer", 4e-4), ("head", 1e-4)) for i in range(3)]
    assert blocks_from_rows(rows) == {"k": pytest.approx(
        {"fwd_bwd_s": 2e-3, "layer_s": 8e-4, "head_s": 2e-4})}
    assert blocks_from_rows([r for r in rows if r["block"] != "fwd_bwd"]) == {}
    sharing = [{"procs": k, "sample": i, "factor": f} for k, fs in ((1, (1.0, 1.0, 1.0)),
                                                                    (2, (0.9, 0.95, 1.3)),
                                                                    (4, (2.0, 3.0, 2.2)))
               for i, f in enumerate(fs)]
    # two processes measured "faster" than one (median 0.95) is drift: never below 1
    assert core_sharing_from_rows(sharing) == {1: 1.0, 2: 1.0, 4: 2.2}


# --- the composed step -----------------------------------------------------------------------

BLOCKS = {"fwd_bwd_s": 8e-3, "layer_s": 3e-3, "embedding_s": 2e-4, "head_s": 1e-3,
          "optimizer_s": 1.5e-3, "optimizer_layer_s": 6e-4}


def _measured(points, sharing=None, collectives=None):
    keys = {block_key(p.model, p.seq_len, p.micro_batch, rates.block_layout(p))
            for p in points.values()}
    return Measured(blocks={k: dict(BLOCKS) for k in keys}, core_sharing=sharing or {},
                    collectives=collectives or {})


def test_a_data_parallel_step_is_composed_from_the_blocks(points, hw):
    coll = {("all_reduce", 2): (1e-3, 1e9), ("all_reduce", 4): (4e-3, 0.5e9)}
    m = _measured(points, {1: 1.0, 2: 1.2, 4: 3.0}, coll)
    b1 = stepmodel.predict_step_time(points[("weak-dp", 1)], hw, m)
    assert b1.composed_from_blocks and b1.core_sharing_slowdown == 1.0
    assert b1.step_time_s == pytest.approx(8e-3 + 1.5e-3)  # one micro-batch + the optimizer
    # strong-dp N=1: 8 micro-batches of 2 sequences
    s1 = stepmodel.predict_step_time(points[("strong-dp", 1)], hw, m)
    assert s1.step_time_s == pytest.approx(8 * 8e-3 + 1.5e-3)
    # weak-dp N=4: 4 processes on 2 cores compute 3x slower; the measured all-reduce of the
    # fp32 gradients (timed with 4 processes on the host) is not slowed again
    p4 = points[("weak-dp", 4)]
    b4 = stepmodel.predict_step_time(p4, hw, m)
    grads = 4 * memory.stage_params(p4.model, 1, 1, 0)
    ar = 4e-3 + grads / 0.5e9
    assert b4.oversubscribed and b4.core_sharing_slowdown == 3.0
    assert b4.dp_comm_exposed_s == pytest.approx(ar)
    assert b4.step_time_s == pytest.approx(3.0 * (8e-3 + 1.5e-3) + ar)
    assert sum(b4.terms().values()) == pytest.approx(b4.step_time_s)
    # the modelled arithmetic stays, the rest of the measured micro-batch is overhead; what
    # the cores' sharing adds to the work is its own term, waiting for a CPU core
    assert b4.gemm_s + b4.attention_s + b4.elementwise_s + b4.overhead_s == pytest.approx(8e-3)
    assert b4.core_wait_s == pytest.approx(2.0 * (8e-3 + 1.5e-3))
    assert b1.core_wait_s == 0.0
    # DDP's own cost (measured on the plain blocks) is overhead of each micro-batch: strong-dp
    # N=2 (4 micro-batches, the last synced), computing 1.2x slower on 2 processes
    key = block_key(p4.model, p4.seq_len, 2, "plain")
    ddp = Measured(blocks={**m.blocks, key: {**m.blocks[key], "ddp_micro_batch_s": 3e-4,
                                             "ddp_sync_s": 1.2e-3}},
                   core_sharing=m.core_sharing, collectives=m.collectives)
    s2 = points[("strong-dp", 2)]
    bare, wrapped = (stepmodel.predict_step_time(s2, hw, x) for x in (m, ddp))
    assert wrapped.overhead_s - bare.overhead_s == pytest.approx(3 * 3e-4 + 1.2e-3)
    assert wrapped.core_wait_s - bare.core_wait_s == pytest.approx(0.2 * (3 * 3e-4 + 1.2e-3))
    assert wrapped.step_time_s - bare.step_time_s == pytest.approx(1.2 * (3 * 3e-4 + 1.2e-3))


def test_a_collective_slows_by_the_sharing_its_measurement_did_not_have(points, hw):
    # the microbench timed a 2-rank collective with 2 processes busy (the others at a
    # barrier): at a 4-process point it slows by sharing(4) / sharing(2); a 4-rank one by 1
    coll = {("all_reduce", 2): (1e-3, 1e9), ("all_reduce", 4): (4e-3, 0.5e9)}
    m = _measured(points, {1: 1.0, 2: 1.25, 4: 3.0}, coll)
    tp4, dp4, tp2 = points[("weak-tp", 4)], points[("weak-dp", 4)], points[("weak-tp", 2)]
    assert host.collective_sharing(tp4, hw, m, 2) == pytest.approx(3.0 / 1.25)
    assert host.collective_sharing(dp4, hw, m, 4) == 1.0
    assert host.collective_sharing(tp2, hw, m, 2) == 1.0
    # declared collectives (nothing measured) take the whole sharing; a GPU none
    assert host.collective_sharing(tp4, hw, Measured(core_sharing={4: 3.0}), 2) == 3.0
    gpu = hardware.HardwareSpec.load("dgx-a100")
    assert host.collective_sharing(tp4, gpu, m, 2) == 1.0
    # in the step: weak-tp N=4 (tp 2 x dp 2) on 4 processes: its TP exchanges and its DP
    # all-reduce (2 ranks each) are 2.4x their time at N=2 (2 processes: 1.25 / 1.25)
    b2, b4 = (stepmodel.predict_step_time(p, hw, m) for p in (tp2, tp4))
    assert b2.tp_comm_s > 0 and b4.tp_comm_s == pytest.approx(2.4 * b2.tp_comm_s)
    grads = 4 * memory.stage_params(tp4.model, 2, 1, 0)
    assert b4.dp_comm_exposed_s == pytest.approx(2.4 * (1e-3 + grads / 1e9))
    assert sum(b4.terms().values()) == pytest.approx(b4.step_time_s)


def test_a_pipeline_step_is_composed_per_stage(points, hw):
    p = points[("strong-pp", 2)]  # 2 stages of 1 layer, 8 micro-batches
    b = stepmodel.predict_step_time(p, hw, _measured(points, {1: 1.0, 2: 1.0}))
    first = 8e-3 - 3e-3 - 1e-3  # no head
    last = 8e-3 - 3e-3 - 2e-4  # no embedding
    p2p = sum(comm.p2p_seconds(p, r, hw, None) for r in (0,))  # declared link: 1 boundary
    assert b.bottleneck_stage == 1
    assert b.micro_batch_slot_s == pytest.approx(last + p2p)
    assert b.pp_bubble_s == pytest.approx(first + p2p)
    opt = 1.5e-3 - 6e-4  # one layer's parameters fewer
    clip = b.optimizer_s - opt
    assert clip >= 0
    assert b.step_time_s == pytest.approx(8 * (last + p2p) + first + p2p + opt + clip)


def test_tensor_parallel_blocks_are_one_ranks_micro_batch(points, hw):
    # timed as rank 0 of the point's 2-rank mesh: the micro-batch is the measured one, its
    # modelled arithmetic (one rank's share) split off as the terms, the rest overhead
    p = points[("weak-tp", 2)]
    b = stepmodel.predict_step_time(p, hw, _measured(points, {1: 1.0, 2: 1.0}))
    assert b.composed_from_blocks
    assert b.gemm_s + b.attention_s + b.elementwise_s + b.overhead_s == pytest.approx(8e-3)
    assert 0 < b.gemm_s < 8e-3


def test_without_blocks_the_preset_path_is_unchanged(points, hw):
    b = stepmodel.predict_step_time(points[("weak-dp", 4)], hw)
    assert not b.composed_from_blocks and b.core_sharing_slowdown == 2.0 and b.oversubscribed


def test_calibration_json_carries_blocks_and_core_sharing(tmp_path, points):
    p = points[("weak-dp", 1)]
    key = block_key(p.model, p.seq_len, p.micro_batch, "plain")
    cal = {"dtype": "fp32", "m": 512, "n": 512, "k": 512, "flops_per_s": 9e10,
           "blocks": [{"key": key, "layout": "plain", "micro_batch": 4, "block": b,
                       "sample": i, "seconds": v} for b, v in BLOCKS.items()
                      for i in range(2)],
           "core_sharing": [{"procs": k, "sample": 0, "seconds": f, "factor": f}
                            for k, f in ((1, 1.0), (2, 1.4))],
           "sync_wait": [{"procs": 2, "grain_s": 2e-3, "sample": 0, "wait_s": 3e-4}]}
    cal = {**cal, "blocks": [{**r, "block": r["block"][:-2]} for r in cal["blocks"]]}
    (tmp_path / "calibration.json").write_text(json.dumps(cal))
    m = Measured.from_calibration(tmp_path / "calibration.json")
    assert m.blocks == {key: pytest.approx(BLOCKS)} and m.core_sharing == {1: 1.0, 2: 1.4}
    assert m.sync_wait == {2: [(2e-3, 3e-4)]}
    assert m.block(p) == pytest.approx(BLOCKS)
    assert m.block(points[("weak-tp", 2)]) is None  # no tp block measured


def test_host_slices_pool_into_the_calibration_each_round_paired_in_its_slice():
    """Two slices of the host calibration, the second on a host 2x slower: every row keeps
    its slice and gets a sample number of its own across the slices, so the in-step optimizer
    (``step`` less ``fwd_bwd`` of the same round) pairs rounds within a slice only; the
    medians pool all rounds; what the device calibration measured stays."""
    from scalestudy.measure.host_slices import with_slices

    def piece(block, ms, sample):
        return {"key": "k", "layout": "plain", "micro_batch": 4, "block": block,
                "sample": sample, "seconds": ms * 1e-3}

    def one_slice(scale, at):
        return {"measured_at": at, "load_1m": 0.5 * scale,
                "blocks": [piece("fwd_bwd", 4.0 * scale, 0), piece("step", 5.0 * scale, 0),
                           piece("fwd_bwd", 6.0 * scale, 1), piece("step", 7.0 * scale, 1)],
                "core_sharing": [{"procs": 1, "sample": 0, "seconds": 0.1, "factor": 1.0},
                                 {"procs": 2, "sample": 0, "seconds": 0.1, "factor": scale}]}

    device = {"dtype": "fp32", "m": 64, "n": 64, "k": 64, "flops_per_s": 1e9,
              "sync_wait": [{"procs": 2, "grain_s": 2e-3, "sample": 0, "wait_s": 3e-4}]}
    rec = with_slices(device, [one_slice(1.0, "t0"), one_slice(2.0, "t1")])
    assert [(r["slice"], r["sample"], r["block"]) for r in rec["blocks"]] == [
        (0, 0, "fwd_bwd"), (0, 0, "step"), (0, 1, "fwd_bwd"), (0, 1, "step"),
        (1, 2, "fwd_bwd"), (1, 2, "step"), (1, 3, "fwd_bwd"), (1, 3, "step")]
    b = blocks_from_rows(rec["blocks"])["k"]
    assert b["fwd_bwd_s"] == pytest.approx(7e-3)  # median of 4, 6, 8, 12 ms
    # pairs 1, 1 ms (slice 0) and 2, 2 ms (slice 1); slice 1's round 0 against slice 0's
    # round 0 (8 - 4 ms) would have been a pairing across two moments of the host
    assert b["step_optimizer_s"] == pytest.approx(1.5e-3)
    assert core_sharing_from_rows(rec["core_sharing"]) == {1: 1.0, 2: 1.5}
    assert rec["sync_wait"] == device["sync_wait"] and rec["flops_per_s"] == 1e9
    assert rec["slices"] == [{"slice": 0, "measured_at": "t0", "load_1m": 0.5},
                             {"slice": 1, "measured_at": "t1", "load_1m": 1.0}]
    # no slice (a GPU study, or no host measurements): the device calibration as it was
    assert with_slices(device, []) == {**device, "slices": []}


# --- waiting for the slowest rank at a synchronisation --------------------------------------

SYNC = {2: [(5e-4, 1e-4), (2e-3, 4e-4), (8e-3, 1e-3)], 4: [(5e-4, 5e-4), (8e-3, 2e-3)]}


def test_sync_wait_seconds_interpolates_in_the_grain():
    w = host.sync_wait_seconds
    assert w(1, 1e-3, SYNC) == 0.0 and w(3, 1e-3, SYNC) == 0.0  # one process; not measured
    assert w(2, 1.25e-3, SYNC) == pytest.approx(2.5e-4)  # halfway between 0.5 and 2 ms
    assert w(4, 1e-4, SYNC) == 5e-4 and w(4, 1.0, SYNC) == 2e-3  # the end values beyond
    assert w(2, 1e-3, {2: [(5e-4, -1e-4), (2e-3, -1e-4)]}) == 0.0  # noise: never negative


def test_sync_wait_from_rows_takes_the_median_per_count_and_grain():
    rows = [{"procs": 2, "grain_s": g, "sample": i, "wait_s": w}
            for g, ws in ((2e-3, (1e-3, 3e-3, 2e-3)), (5e-4, (1e-4, 2e-4, 3e-4)))
            for i, w in enumerate(ws)]
    assert rates.sync_wait_from_rows(rows) == {2: [(5e-4, pytest.approx(2e-4)),
                                                       (2e-3, pytest.approx(2e-3))]}


def test_sync_counts_by_hand(points, hw):
    # weak-tp N=2: 2 layers x 4 exchanges + the embedding's + the head's 2, one stage, no DP
    assert host.sync_counts(points[("weak-tp", 2)], hw, 0, 2, 0) == (11, 0)
    # weak-tp N=4 adds DDP's one gradient all-reduce a step
    assert host.sync_counts(points[("weak-tp", 4)], hw, 0, 2, 0) == (11, 1)
    # strong-pp N=2: each stage's two transfers (activation out, gradient back) with its
    # one neighbour; N=4 adds the gradient reduction of each stage's DP pair
    pp2, pp4 = points[("strong-pp", 2)], points[("strong-pp", 4)]
    assert [host.sync_counts(pp2, hw, r, 1, 0) for r in (0, 1)] == [(2, 0), (2, 0)]
    assert host.sync_counts(pp4, hw, 1, 1, 0) == (2, 1)
    assert host.sync_counts(points[("weak-dp", 1)], hw, 0, 2, 0) == (0, 0)


def test_sync_waits_enter_the_slot_and_the_step(points, hw):
    p = points[("weak-tp", 4)]  # 4 processes, 11 exchanges a micro-batch, 1 DDP all-reduce
    m = _measured(points, {1: 1.0, 2: 1.0, 4: 2.0})
    base = stepmodel.predict_step_time(p, hw, m)
    waits, dp = host.sync_wait_terms(p, hw, SYNC, [11e-3], [2], [0])
    # 11 exchanges after 1 ms each: 11 x 5.3e-4 (4 processes, 1 ms: 5e-4 + 1.5e-3 * 0.5/7.5);
    # the step's all-reduce after its 11 ms: the 8 ms end value
    assert waits[0] == pytest.approx(11 * (5e-4 + 1.5e-3 * 0.5e-3 / 7.5e-3))
    assert dp == pytest.approx(2e-3)
    b = stepmodel.predict_step_time(p, hw, replace(m, sync_wait=SYNC))
    assert b.sync_wait_s > 0 and base.sync_wait_s == 0.0
    assert b.step_time_s == pytest.approx(base.step_time_s + b.sync_wait_s)
    assert sum(b.terms().values()) == pytest.approx(b.step_time_s)
    # a GPU system (no shared cores) never waits by this term
    gpu = hardware.HardwareSpec.load("h200")
    assert host.sync_wait_terms(p, gpu, SYNC, [1.0], [2], [0]) \
        == ([0.0], 0.0)


# --- predicted before run --------------------------------------------------------------------


RATE = 0.6  # the software rate the hand-made measurements of ``_pred_and_runs`` run at


def _pred_and_runs(points, hw):
    """The default study predicted on cpu-local, and a runs frame made by hand: weak-dp N = 1
    and 2 measured three times each around the model's step at ``RATE`` (their medians on
    it), N = 4 on it; strong-dp N = 1 measured at 50 ms (not the model's shape at any
    particular rate), its N = 2 crashed; weak-tp and strong-pp not measured at all."""
    from scalestudy.perf import anchor

    pts = list(points.values())
    pred = predict.study_predictions(pts, hw)
    rows = []

    def add(series, n, steps, status="ok"):
        p = points[(series, n)]
        for i, t in enumerate(steps):
            rows.append({"config_hash": p.config_hash, "point_id": f"{series}-{n}-{i}",
                         "series": series, "n": n, "status": status, "step_time_median_s": t})

    for n in (1, 2):
        t = anchor.step_at_rate(points[("weak-dp", n)], hw, RATE)
        add("weak-dp", n, [1.1 * t, t, 0.95 * t])
    add("weak-dp", 4, [anchor.step_at_rate(points[("weak-dp", 4)], hw, RATE)])
    add("strong-dp", 1, [0.05, 0.06, 0.04])
    add("strong-dp", 2, [9.0], status="crashed")
    return pts, pred, pd.DataFrame(rows)


def test_before_run_anchors_reproduce_the_measured_points(points, hw):
    pts, pred, runs = _pred_and_runs(points, hw)
    before = before_run.before_run_calibration(pred, runs, 2, "2026-12-01T00:00:00+00:00",
                                            points=pts, hw=hw)
    assert list(before.columns) == before_run.BEFORE_RUN_COLUMNS
    by = before.set_index(["series", "n"])
    # strong-dp: its one anchor (N = 1, median 50 ms) is passed through exactly and is the
    # curve's baseline; its crashed N = 2 is neither an anchor nor predicted
    a = by.loc[("strong-dp", 1)]
    assert bool(a["anchored"]) and a["predicted_before_run_s"] == pytest.approx(0.05, rel=1e-5)
    assert a["predicted_efficiency_before_run"] == pytest.approx(1.0)
    assert a["calibrated_on"] == "strong-dp N=1"
    assert ("strong-dp", 2) not in by.index and not bool(by.loc[("strong-dp", 4), "anchored"])
    # the predicted point is at the same rate; its efficiency is against the anchor's throughput
    x1 = points[("strong-dp", 1)].tokens_per_step / 0.05
    p4 = by.loc[("strong-dp", 4)]
    assert p4["software_rate"] == pytest.approx(a["software_rate"])
    assert p4["predicted_efficiency_before_run"] == pytest.approx(
        points[("strong-dp", 4)].tokens_per_step / (p4["predicted_before_run_s"] * 4) / x1)
    for r in before.itertuples():
        assert r.predicted_efficiency_before_run_low <= r.predicted_efficiency_before_run + 1e-12
        assert r.predicted_efficiency_before_run <= r.predicted_efficiency_before_run_high + 1e-12
    with pytest.raises(ValueError, match="calibrate_on_max_n=0"):
        before_run.before_run_calibration(pred, runs, 0, points=pts, hw=hw)
    crashed = runs.assign(status="crashed")
    with pytest.raises(ValueError, match="no measured point"):
        before_run.before_run_calibration(pred, crashed, 2, points=pts, hw=hw)


def test_before_run_series_at_a_known_rate_is_predicted_back(points, hw):
    from scalestudy.perf import anchor

    pts, pred, runs = _pred_and_runs(points, hw)
    before = before_run.before_run_calibration(pred, runs, 2, points=pts, hw=hw)
    by = before.set_index(["series", "n"])
    truth = {n: anchor.step_at_rate(points[("weak-dp", n)], hw, RATE) for n in (1, 2, 4)}
    x = {n: points[("weak-dp", n)].tokens_per_step / (t * n) for n, t in truth.items()}
    assert by.loc[("weak-dp", 1), "calibrated_on"] == "weak-dp N=1,2"
    for n in (1, 2, 4):
        r = by.loc[("weak-dp", n)]
        assert bool(r["anchored"]) == (n <= 2)
        assert r["software_rate"] == pytest.approx(RATE, rel=1e-4)
        assert r["predicted_before_run_s"] == pytest.approx(truth[n], rel=1e-4)
        assert r["predicted_efficiency_before_run"] == pytest.approx(x[n] / x[1], rel=1e-4)
        # the model at the preset's rate is kept beside it
        assert r["step_time_s"] == pytest.approx(
            float(pred.set_index("config_hash").loc[points[("weak-dp", n)].config_hash,
                                                    "step_time_s"]))


def test_before_run_series_without_a_measured_point_takes_every_series_anchors(points, hw):
    from scalestudy.perf import anchor

    pts, pred, runs = _pred_and_runs(points, hw)
    before = before_run.before_run_calibration(pred, runs, 2, points=pts, hw=hw)
    tp = before[before["series"] == "weak-tp"]
    assert tp["n"].tolist() == [4]  # its unmeasured N = 2 was to run first: not in the file
    r = tp.iloc[0]
    assert r["calibrated_on"] == "all series, N <= 2" and not bool(r["anchored"])
    every = [(points[("weak-dp", 1)], 1.0 * anchor.step_at_rate(points[("weak-dp", 1)], hw, RATE)),
             (points[("weak-dp", 2)], anchor.step_at_rate(points[("weak-dp", 2)], hw, RATE)),
             (points[("strong-dp", 1)], 0.05)]
    assert r["software_rate"] == pytest.approx(anchor.anchored_rate(every, hw), rel=1e-4)
    # its efficiency is against its own smallest N, predicted at that rate
    assert r["predicted_efficiency_before_run"] == pytest.approx(
        anchor.predict_series([points[("weak-tp", 2)], points[("weak-tp", 4)]], every,
                              hw)[1].efficiency, rel=1e-6)


def test_versus_measured_joins_the_prediction_made_before_the_run(points, hw, tmp_path):
    pts, pred, runs = _pred_and_runs(points, hw)
    # time stamps in milliseconds (the runner's and the prediction's): a point that starts
    # within the second its prediction was written is still ordered after it
    before = before_run.before_run_calibration(pred, runs, 2, "2026-12-01T10:00:00.100+00:00",
                                            points=pts, hw=hw)
    vm = predict.versus_measured(pred, runs, before)
    by = vm.set_index(["series", "n"])
    r = by.loc[("weak-dp", 4)]
    assert r["before_run_residual"] == pytest.approx(0.0, abs=1e-4)  # generated at RATE
    assert r["measured_efficiency"] == pytest.approx(r["predicted_efficiency_before_run"],
                                                     rel=1e-4)
    # the anchors join the curve, not the before-run residuals (they ran first)
    a = by.loc[("weak-dp", 1)]
    assert bool(a["anchored"]) and pd.isna(a["predicted_before_run_s"])
    assert pd.isna(a["predicted_at"]) and a["predicted_efficiency_before_run"] == 1.0
    assert a["measured_efficiency"] == pytest.approx(1.0)
    assert pd.isna(by.loc[("strong-pp", 2), "predicted_efficiency_before_run"])
    h4, hs = points[("weak-dp", 4)].config_hash, points[("strong-dp", 4)].config_hash
    for pid, started in (("weak-dp-4-0", "2026-12-01T10:00:00.250+00:00"),):
        (tmp_path / "runs" / pid).mkdir(parents=True)
        (tmp_path / "runs" / pid / "status.json").write_text(json.dumps({"started": started}))
    vm2 = before_run.started_before(vm, runs, tmp_path).set_index("config_hash")
    assert vm2.loc[h4, "predicted_before_start"] == True  # noqa: E712 (a pandas object)
    assert pd.isna(vm2.loc[hs, "predicted_before_start"])  # not run
    assert pd.isna(vm2.loc[points[("weak-dp", 1)].config_hash, "predicted_before_start"])
    predict.residual_figure(vm.assign(oversubscribed=False), tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
    assert before_run.before_run_figure(vm, tmp_path / "e.png") == tmp_path / "e.png"
    assert (tmp_path / "e.png").stat().st_size > 0
    assert before_run.before_run_figure(predict.versus_measured(pred, runs), tmp_path / "x.png") \
        is None


def test_the_study_option_is_typed_and_checked():
    assert load_study(DEFAULT).predict.before_run_max_n is None
    doc = {"name": "s", "models": {"m": {"layers": 2, "hidden": 64, "heads": 4,
                                         "seq_len": 32, "vocab": 64}},
           "platform": {"device": "cpu"},
           "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2, 4],
                       "micro_batch": 2}],
           "predict": {"before_run": {"calibrate_on_max_n": 2}}}
    assert validate(doc).predict.before_run_max_n == 2
    with pytest.raises(StudyError, match="predict.before_run.calibrate_on_max_n: 4 leaves"):
        validate({**doc, "predict": {"before_run": {"calibrate_on_max_n": 4}}})
    with pytest.raises(StudyError, match="CPU study only"):
        validate({**doc, "platform": {"device": "cuda"}})
    with pytest.raises(StudyError, match="calibrate_on_max_n"):
        validate({**doc, "predict": {"before_run": {}}})


# --- the measurements' records (shape, not speed) ------------------------------------------


def test_block_specs_bench_blocks_and_core_sharing_rows(points):
    from scalestudy.config.parts import Model
    from scalestudy.measure.blocks import BLOCKS, DDP_BLOCKS, bench_blocks, block_spec, block_specs
    from scalestudy.measure.host_sharing import bench_core_sharing, bench_sync_wait

    specs = block_specs(points.values())
    # the default study's distinct blocks; DDP's where a point of them runs under it (the
    # strong-pp and weak-tp points' replicate does not)
    assert sorted((s["micro_batch"], s["layout"], s["ddp"]) for s in specs) == [
        (2, "plain", True), (4, "plain", True), (4, "tp2", False)]
    tiny = Model(name="t", layers=2, hidden=16, heads=2, seq_len=8, vocab=32)
    rows = bench_blocks([block_spec(tiny, 2, "plain", ddp=True), block_spec(tiny, 2, "tp2")],
                        samples=2, warmup=1, min_time_s=0.0)
    # two rounds, one sample of every piece of both layouts in each (DDP's in the plain one)
    timed = {"plain": BLOCKS + DDP_BLOCKS, "tp2": BLOCKS}
    assert sorted((r["key"], r["block"], r["sample"]) for r in rows) == sorted(
        (block_key(tiny, 8, 2, lay), b, i) for lay, bs in timed.items() for b in bs
        for i in (0, 1))
    blocks = blocks_from_rows(rows)
    assert set(blocks) == {block_key(tiny, 8, 2, "plain"), block_key(tiny, 8, 2, "tp2")}
    for lay, bs in timed.items():
        v, measured = blocks[block_key(tiny, 8, 2, lay)], {f"{b}_s" for b in bs}
        paired = {"step_optimizer_s"} | ({"ddp_micro_batch_s", "ddp_sync_s"}
                                         if lay == "plain" else set())
        assert set(v) == measured | paired and min(v[b] for b in paired) >= 0
        assert min(v[b] for b in measured) > 0
    sharing = bench_core_sharing(procs=(1, 2), work_s=0.005, samples=1)
    assert [r["procs"] for r in sharing] == [1, 2] and sharing[0]["factor"] == 1.0
    assert all(r["seconds"] > 0 and r["load_1m"] >= 0 for r in sharing)
    sync = bench_sync_wait(procs=(1, 2), grains=(5e-4, 1e-3), samples=1, phase_s=0.005)
    assert [(r["procs"], r["grain_s"]) for r in sync] == [(2, 5e-4), (2, 1e-3)]
    for r in sync:  # the wait is what the synchronised loop adds beyond the latency
        assert r["alone_s"] > 0 and r["alpha_s"] > 0
        assert r["wait_s"] == pytest.approx(r["synced_s"] - r["alone_s"] - r["alpha_s"])


def test_a_spec_process_group_is_the_points_mesh_without_peers():
    import torch
    import torch.distributed as dist

    from scalestudy.measure.blocks import spec_process_group

    with spec_process_group(2, False) as mesh:  # rank 0 of 2 on the fake backend
        assert mesh.size() == 2 and dist.get_rank() == 0 and dist.get_backend() == "fake"
        x = torch.full((3,), 2.0)
        dist.all_reduce(x)  # no peer to wait for: returns at once, the data as it was
        assert x.tolist() == [2.0, 2.0, 2.0]
    assert not dist.is_initialized()
    with spec_process_group(1, True) as mesh:  # DDP's blocks: a one-rank gloo group
        assert mesh is None and dist.get_world_size() == 1 and dist.get_backend() == "gloo"
        with pytest.raises(RuntimeError, match="call it outside torch.distributed"):
            with spec_process_group(2, False):
                pass
    with spec_process_group(1, False) as mesh:
        assert mesh is None and not dist.is_initialized()


def test_collectives_slices_pool_into_one_table_whose_median_the_model_takes(tmp_path):
    from scalestudy.measure.collectives import pool_slices

    def one_slice(k, ms):
        path = tmp_path / f"slice_{k}.csv"
        pd.DataFrame([{"op": "all_reduce", "group_size": 2, "bytes": b, "sample": i,
                       "seconds": t * 1e-3 * (1 + b / 65536)}
                      for b in (4096, 65536) for i, t in enumerate(ms)]).to_csv(path, index=False)
        return str(path)

    out = tmp_path / "collectives.csv"
    pool_slices([one_slice(0, (1.0, 1.0)), one_slice(1, (4.0, 4.0)), one_slice(2, (2.0, 2.0))],
                str(out), str(tmp_path / "log"))
    rows = pd.read_csv(out)
    assert sorted(rows["slice"].unique()) == [0, 1, 2] and len(rows) == 12
    # the model's all-reduce at 4 KB: the median over the three slices' samples (2 ms), not
    # the slow slice's (4 ms) nor the fast one's (1 ms)
    m = Measured.from_csv(None, str(out))
    assert m.collective_time("all_reduce", 4096, 2) == pytest.approx(2e-3 * (1 + 4096 / 65536))


def test_a_host_slice_times_the_blocks_and_the_core_sharing_in_its_own_process(tmp_path):
    from scalestudy.config.parts import Model
    from scalestudy.measure.blocks import BLOCKS, block_spec
    from scalestudy.record.io import read_json

    tiny = Model(name="t", layers=2, hidden=16, heads=2, seq_len=8, vocab=32)
    out = tmp_path / "slice_0.json"
    assert cli.main(["host-slices", "--device", "cpu", "--out", str(out), "--block-rounds", "2",
                             "--sharing-rounds", "1",
                             "--blocks-json", json.dumps([block_spec(tiny, 2, "plain")]),
                             "--core-sharing", "2"]) == 0
    rec = read_json(out)
    assert {(r["block"], r["sample"]) for r in rec["blocks"]} == {
        (b, i) for b in BLOCKS for i in (0, 1)}  # two rounds of every piece
    assert [(r["procs"], r["sample"]) for r in rec["core_sharing"]] == [(1, 0), (2, 0)]
    assert {(r["procs"], r["sample"]) for r in rec["sync_wait"]} == {(2, 0)}  # one round
    assert rec["load_1m"] >= 0 and rec["measured_at"].endswith("+00:00")


def test_core_sharing_after_torch_ran_with_several_threads():
    """A host with more cores than devices gives each process several threads: the core
    sharing's processes must not hang in their first parallel region (forked after torch's
    OpenMP pool ran, they did), and each runs with the measuring process's threads."""
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(2); a = torch.randn(256, 256); a @ a\n"
            "from scalestudy.measure.host_sharing import bench_core_sharing\n"
            "rows = bench_core_sharing((1, 2), work_s=0.005, samples=1)\n"
            "assert [r['procs'] for r in rows] == [1, 2], rows\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_calibration_times_blocks_only_of_models_it_can_afford():
    """A point whose one micro-batch exceeds MAX_BLOCK_FLOPS (a fault test's 16k-token
    math-attention model) keeps the product-rate model: its blocks are not timed."""
    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model
    from scalestudy.measure.blocks import MAX_BLOCK_FLOPS, block_flops, block_specs
    from scalestudy.config import flops

    small = Point.for_layout(Model(layers=2, hidden=32, heads=2, seq_len=16, vocab=64),
                             micro_batch=2)
    huge = Point.for_layout(Model(layers=2, hidden=32, heads=4, seq_len=16384, vocab=64,
                                  attention="math"), micro_batch=1)
    assert block_flops(small) == 3 * (2 * flops.layer_forward_flops(small.model, 2)
                                      + flops.head_forward_flops(small.model, 2))
    assert block_flops(small) < MAX_BLOCK_FLOPS < block_flops(huge)
    assert [s["model"]["name"] for s in block_specs([small, huge])] == [small.model.name]


def test_blocks_of_a_llama_model_are_timed():
    """Llama's blocks take the rotary table: the calibration times them like GPT's."""
    from scalestudy.config.parts import Model
    from scalestudy.measure.blocks import bench_blocks, block_spec

    m = Model(arch="llama", layers=2, hidden=32, heads=2, seq_len=16, vocab=64)
    rows = bench_blocks([block_spec(m, 1, "plain")], samples=1, warmup=0, min_time_s=0.0)
    assert {r["block"] for r in rows} == {"fwd_bwd", "layer", "embedding", "head", "optimizer",
                                          "optimizer_layer", "step"}
    assert all(r["seconds"] > 0 for r in rows)
