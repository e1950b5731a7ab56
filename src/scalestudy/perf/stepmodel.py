"""Predicted step time of a training point, as the sum of its terms.

``predict_step_time(point, hw, measured=None, dp_overlap=None)`` returns a ``StepBreakdown``:
seconds per optimizer step of the bottleneck pipeline stage. Per stage ``r`` one micro-batch
takes a slot, its compute plus its exposed TP, P2P and CP communication; the pipeline of
slots takes ``m · slot + bubble``; the step adds the exposed DP communication and the
optimizer. The terms are pure functions of ``terms_compute`` and ``terms_comm`` at the rates of
``rates`` (every hardware or framework figure from ``data/hardware.yaml``, ``hw``, or from
measurements, ``measured``; nothing is fitted to a published result); on a CPU host
``host.correct`` composes the stages from measured blocks and slows them by the sharing of
the cores. The computing phases divide by the framework's ``software_rate`` (its kernels'
speed relative to the software the shared constants were set on; ``scalestudy.perf.anchor``
solves for it from measured points). ``predict_range`` evaluates a point under every scenario of ``hw.scenarios()``.

Not modelled: kernel-launch gaps on GPUs where none is declared, load imbalance between stages
other than the layers, the embedding and the head, network contention beyond the per-device
NIC share, stragglers, the operating system's scheduling beyond the core-sharing slowdown.
Where these matter the model under-predicts.
"""

from __future__ import annotations

from scalestudy.config.point import Point
from scalestudy.config.vocab import Checkpointing, DType
from scalestudy.config import flops
from scalestudy.config import partition
from scalestudy.perf import host, kernels, memory
from scalestudy.perf.breakdown import Prediction, StepBreakdown
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import ACT_BYTES, Measured
from scalestudy.perf.terms_comm import (boundary_crosses_node, clip_seconds, cp_exchange_seconds,
                                        dp_comm_seconds, dp_overlap_fraction,
                                        dp_step_exposed_seconds, fsdp_layer_seconds,
                                        fsdp_per_block, p2p_seconds, pipeline_seconds,
                                        stage_tp_seconds, syncs_every_micro_batch,
                                        tied_grad_seconds, tp_overlap)
from scalestudy.perf.terms_compute import (cp_local, grad_accumulation_seconds, grad_bytes_of,
                                           launch_gap_seconds, layer_costs, optimizer_step_seconds,
                                           overhead_seconds, rng_state_seconds, stage_terms,
                                           tensor_sync_seconds)


def _dp_replicated(point: Point, hw: HardwareSpec, measured: Measured | None, params: float,
                   overlap: float, t_comp: float) -> tuple[float, float, str]:
    """Replicated data parallelism (DDP, ZeRO): its traffic per step (s), the part of it left
    exposed behind one micro-batch's backward (``t_comp``: its compute, s; the backward is
    2/3 of it, no recompute share) and the link it crosses."""
    t_dp_step, t_dp_mb, dp_link = dp_comm_seconds(point, params, hw, measured)
    m = max(1, int(point.grad_accum))
    exposed = dp_step_exposed_seconds(point, hw, t_dp_step, t_dp_mb, overlap, t_comp * 2 / 3,
                                      t_comp)
    return t_dp_step + m * t_dp_mb, exposed, dp_link


def _optimizer_seconds(point: Point, hw: HardwareSpec, measured: Measured | None,
                       update_s: float, clip_factor: float, stage: int, layers: int) -> float:
    """The optimizer's step (s): its update on its shard (``update_s``), clipping's reduction
    of the squared norm of sharded gradients (times ``clip_factor``, the host's), and the
    framework's per-tensor checks that read a value back to the host (``stage``'s tensors)."""
    fw = hw.framework
    return (update_s + clip_factor * clip_seconds(point, hw, measured)
            + tensor_sync_seconds(memory.stage_param_tensors(
                point.model, point.pp, stage, layers, fw.fused_qkv), hw))


def _pp_link(point: Point, hw: HardwareSpec) -> str:
    """``inter`` where a pipeline boundary crosses nodes of a system with an inter-node link,
    else ``intra``."""
    multi = any(boundary_crosses_node(point, r, hw.devices_per_node) for r in range(point.pp - 1))
    return "inter" if (point.pp > 1 and multi and hw.inter is not None) else "intra"


def predict_step_time(point: Point, hw: HardwareSpec, measured: Measured | None = None,
                      dp_overlap: float | None = None) -> StepBreakdown:
    """The step of ``point`` on ``hw`` as a ``StepBreakdown`` (module doc). ``measured``:
    building blocks measured on the machine (they replace the declared rates where they
    cover a product, a collective or the bandwidth); ``dp_overlap`` overrides the framework's
    DP overlap."""
    model, par, fw = point.model, point.parallel, hw.framework
    tp, pp = point.tp, point.pp
    b, m, s = point.micro_batch, max(1, int(point.grad_accum)), model.seq_len
    v, ckpt = point.stages_per_rank, par.activation_checkpointing
    sp, dtype = par.sequence_parallel and tp > 1, DType(point.train.precision)
    if tp > hw.devices_per_node:
        raise ValueError(f"tp={tp} exceeds devices_per_node={hw.devices_per_node} of hardware {hw.name!r}")
    layers_of, ckpts, stage_p = _stages(point)
    last = [r == pp - 1 for r in range(pp)]
    params = max(stage_p)  # the stage with the most parameters reduces and updates last
    biggest = stage_p.index(params)

    # compute of one micro-batch per stage (one TP rank's, one CP rank's share of the tokens)
    c = cp_local(layer_costs(point, hw, measured), point.cp)
    att_re = c.attn_fwd if ckpt == Checkpointing.SELECTIVE_ATTENTION else 0.0
    ovh = hw.overhead if measured is None or not measured.overhead else measured.overhead
    gbytes = grad_bytes_of(point, fw)
    work = _stage_work(point, hw, measured, c, att_re, ovh, layers_of, ckpts, stage_p, gbytes)
    # communication of one micro-batch per stage: TP, P2P, CP (recompute: 1 all-gather)
    tps = [stage_tp_seconds(c, tp, layers_of[r], ckpts[r], r == 0, last[r], tp_overlap(fw, sp))
           for r in range(pp)]
    p2ps = [p2p_seconds(point, r, hw, measured) for r in range(pp)]
    t_cp = cp_exchange_seconds(model, s, b, tp, point.cp, ACT_BYTES[dtype != DType.FP32], hw,
                               measured, point.platform.devices_per_node)
    cps = [(layers_of[r] + ckpts[r] / 2) * t_cp for r in range(pp)]

    # on a CPU host: the stages composed from measured blocks, the cores' sharing, the waits
    hc = host.correct(point, hw, measured, work, layers_of, ckpts)
    # the computing phases run at the framework's software rate (1 for the software the
    # shared constants were set on; anchoring a series on measured points solves for it)
    work, cs = hc.work, hc.compute / fw.software_rate
    # the computing terms at the unshared rate; what the cores' sharing adds to them is the
    # ranks' waiting for a CPU core (``core_wait_s``), the term a trace reads as the same
    own, shared = 1.0 / fw.software_rate, (hc.compute - 1.0) / fw.software_rate

    # the framework's synchronous copies of the generator state to and from the host
    rng = [rng_state_seconds(layers_of[r], ckpts[r], hw) for r in range(pp)]
    # slot = compute + TP + P2P + CP; the pipeline of slots = m · slot + bubble
    slots = [cs * work.local(r) + rng[r] + hc.tp * tps[r] + hc.pp * p2ps[r] + hc.cp * cps[r]
             + hc.waits[r] for r in range(pp)]
    worst = max(range(pp), key=lambda r: slots[r])
    t_pipe, t_bubble = pipeline_seconds(slots, m, v)
    t_comp = sum(work.arithmetic[worst]) / fw.software_rate

    # exposed data parallelism: before it, the first and the last stage all-reduce their tied
    # embedding's gradient; FSDP on a GPU per block, under each block's compute
    ov = dp_overlap_fraction(point, hw, dp_overlap)
    if fsdp_per_block(point, hw):
        lb = layers_of[biggest]
        t_dp_traffic, t_dp, dp_link = _fsdp_per_block(point, hw, measured, c, cs, att_re, lb,
                                                      ckpts[biggest], params, ov)
    else:
        t_dp_traffic, t_dp, dp_link = _dp_replicated(point, hw, measured, params, ov, t_comp)
    t_tied = tied_grad_seconds(point, hw, kernels.accumulated_grad_bytes(
        fw.grad_accumulation, gbytes), measured)
    t_dp_exposed = hc.pp * t_tied + hc.dp * t_dp

    t_opt = _optimizer_seconds(point, hw, measured, cs * work.optimizer, hc.clip, biggest,
                               layers_of[biggest])

    step = t_pipe + t_dp_exposed + t_opt + hc.dp_wait
    gemm, attn, elem = work.arithmetic[worst]
    t_core = shared * (m * work.local(worst) + work.optimizer)
    return StepBreakdown(
        step_time_s=step,
        gemm_s=m * gemm * own,
        attention_s=m * attn * own,
        elementwise_s=m * elem * own,
        overhead_s=m * ((work.overhead[worst] + work.gaps[worst]) * own + rng[worst]),
        tp_comm_s=m * tps[worst] * hc.tp,
        pp_p2p_s=m * p2ps[worst] * hc.pp,
        pp_bubble_s=t_bubble,
        dp_comm_exposed_s=t_dp_exposed,
        optimizer_s=t_opt - shared * work.optimizer,
        core_wait_s=t_core,
        cp_comm_s=m * cps[worst] * hc.cp,
        grad_accum_s=m * work.grad_accum[worst] * own,
        sync_wait_s=m * hc.waits[worst] + hc.dp_wait,
        dp_comm_s=hc.pp * t_tied + hc.dp * t_dp_traffic,
        bubble_fraction=t_bubble / (m * slots[worst]),
        micro_batch_slot_s=slots[worst],
        bottleneck_stage=worst,
        core_sharing_slowdown=cs,
        oversubscribed=hc.oversubscribed,
        composed_from_blocks=hc.composed,
        **_rates(point, hw, step, c),
        dp_overlap=ov,
        dp_link=dp_link,
        pp_link=_pp_link(point, hw),
        hardware=hw.name,
        framework=fw.name,
    )


def _stages(point: Point) -> tuple[list, list, list]:
    """Per pipeline rank: its layers (uneven partitions), the layers it recomputes, its
    parameters (one TP rank's)."""
    model, par, pp = point.model, point.parallel, point.pp
    v = point.stages_per_rank
    layers_of = partition.rank_layers(point)
    ckpts = [memory.checkpointed_layers(model.layers, pp, r, v, par.activation_checkpointing,
                                        partition.stage_layers(point)) for r in range(pp)]
    return layers_of, ckpts, [memory.stage_params(model, point.tp, pp, r, layers_of[r])
                              for r in range(pp)]


def _stage_work(point: Point, hw: HardwareSpec, measured: Measured | None, c, att_re: float,
                ovh, layers_of: list, ckpts: list, stage_p: list, gbytes: int) -> host.StageWork:
    """What each pipeline stage computes for one micro-batch (``c``: one layer's costs;
    ``layers_of``, ``ckpts``: each stage's layers and recomputed layers; ``stage_p``: its
    parameters), and the optimizer step of the stage with the most parameters."""
    pp, fw = point.pp, hw.framework
    m, lps = max(1, int(point.grad_accum)), point.model.layers / pp
    last = [r == pp - 1 for r in range(pp)]
    # a shard synced every micro-batch adds dp times fewer parameters: not counted
    accumulates = not syncs_every_micro_batch(point, fw)
    return host.StageWork(
        arithmetic=[stage_terms(c, layers_of[r], ckpts[r], att_re, last[r]) for r in range(pp)],
        overhead=[overhead_seconds(ovh, "fwd_bwd", lps, point.tp)] * pp,
        gaps=[launch_gap_seconds(c, lps, ckpts[r], last[r], hw) for r in range(pp)],
        grad_accum=[grad_accumulation_seconds(stage_p[r], m, fw.grad_accumulation, gbytes, hw,
                                              measured) / m if accumulates else 0.0
                    for r in range(pp)],
        optimizer=optimizer_step_seconds(point, max(stage_p), hw, ovh, measured))


def _fsdp_per_block(point: Point, hw: HardwareSpec, measured: Measured | None, c, cs: float,
                    att_re: float, lb: float, ckpt_layers: float, params: float,
                    ov: float) -> tuple[float, float, str]:
    """FSDP on a GPU gathering and reducing per block, under each block's compute: the
    traffic (s), its exposed part (s) and the link, of the stage with the most parameters
    (``lb`` layers, ``ckpt_layers`` of them recomputed)."""
    block = sum(flops.layer_params(point.model, point.tp).values())
    fwd_l = cs * (c.gemm_fwd + c.attn_fwd + c.elementwise / 3)  # one block's compute
    bwd_l = (cs * (c.gemm_bwd + c.attn_bwd + 2 * c.elementwise / 3 + att_re)
             + fwd_l * ckpt_layers / max(1, lb))  # with its recomputed share
    return fsdp_layer_seconds(point, hw, lb, block, params - lb * block, fwd_l, bwd_l, ov,
                              measured)


def _rates(point: Point, hw: HardwareSpec, step: float, c) -> dict:
    """The step's throughput and FLOP rates (StepBreakdown's fields): tokens, model and
    hardware FLOPs per step, MFU and HFU against the peak, the matrix products' rate."""
    model, tp, n = point.model, point.tp, point.n
    b, s, gb = point.micro_batch, model.seq_len, int(point.global_batch)
    lps = model.layers / point.pp
    mflops = flops.model_flops_per_step(model, gb)
    hflops = flops.hardware_flops_per_step(model, gb, "megatron",
                                           point.parallel.activation_checkpointing)
    peak = hw.peak(DType(point.train.precision))
    matmul_flops = (lps * flops.layer_forward_flops(model, b) / tp
                    + 2.0 * s * b * model.hidden * model.vocab / tp) / point.cp  # a cp rank's
    return dict(
        tokens_per_step=gb * s, tokens_per_s=gb * s / step,
        model_flops_per_step=mflops, hardware_flops_per_step=hflops,
        mfu=flops.utilisation(mflops, step, n, peak),
        hfu=flops.utilisation(hflops, step, n, peak),
        tflops_per_device=hflops / (step * n) / 1e12,
        matmul_flops_per_s=matmul_flops / (lps * (c.gemm_fwd + c.attn_fwd) + c.head_fwd),
        matmul_rate_source="measured" if c.measured else "declared")


def predict_range(point: Point, hw: HardwareSpec, measured: Measured | None = None,
                  dp_overlap: float | None = None) -> Prediction:
    """``predict_step_time`` under every scenario of ``hw.scenarios()``."""
    sc = {label: predict_step_time(point, h, measured, dp_overlap) for label, h in hw.scenarios()}
    return Prediction(central=sc["central"], scenarios=sc)

