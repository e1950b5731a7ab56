"""The step's communication terms, each a pure function with its units and source
(``docs/performance-model.md`` has the full table):

- ``tp_comm_s`` — exposed tensor-parallel collectives (``tp_collective_seconds``,
  ``stage_tp_seconds``), minus the framework's declared overlap (``tp_overlap``).
- ``cp_comm_s`` — context parallelism's K/V exchange (``cp_exchange_seconds``), exposed.
- ``pp_p2p_s`` — exposed pipeline transfers (``p2p_seconds``), as the framework schedules
  them (blocking or batched, partitioned over TP, overlapped with interleaving).
- ``pp_bubble_s`` — the pipeline fill and drain (``pipeline_seconds``): the other stages'
  micro-batch slots, divided by ``v``.
- ``dp_comm_exposed_s`` — the data-parallel gradient traffic left after the framework's
  overlap (``dp_comm_seconds`` / ``dp_step_exposed_seconds``), and before it the tied
  embedding's gradient all-reduce between the first and the last pipeline stage
  (``tied_grad_seconds``); gradient clipping's norm all-reduce (``clip_seconds``).

Ring collectives cost ``rates.collective_time``: the system's links, or the measured fits.
"""

from __future__ import annotations

from scalestudy.config.point import Model, Point
from scalestudy.config.vocab import DPMode, DType
from scalestudy.perf.hardware import Framework, HardwareSpec
from scalestudy.perf.rates import ACT_BYTES, Measured, collective_time


def tp_collective_seconds(act_bytes: float, tp: int, hw: HardwareSpec, sp: bool = False,
                          measured: Measured | None = None) -> float:
    """Seconds of one Megatron TP exchange of a ``b·s·h`` activation (``act_bytes``) on the
    intra-node link: an all-reduce, or with sequence parallelism an all-gather plus a
    reduce-scatter of the same volume (Korthikanti et al. 2022). A layer does 2 in the forward
    and 2 in the backward pass (Shoeybi et al. 2019, Fig. 4), 2 more when it is recomputed."""
    if tp <= 1:
        return 0.0
    if sp:
        return (collective_time("all_gather", act_bytes, tp, hw.intra, measured)
                + collective_time("reduce_scatter", act_bytes, tp, hw.intra, measured))
    return collective_time("all_reduce", act_bytes, tp, hw.intra, measured)


def tp_overlap(fw: Framework, sp: bool) -> float:
    """The hidden fraction of TP collectives under ``fw`` (0 unless it overlaps them; Megatron
    only with sequence parallelism, hardware.yaml ``frameworks``)."""
    return fw.tp_overlap if (sp or not fw.tp_overlap_needs_sp) else 0.0


def stage_tp_seconds(c, tp: int, layers: int, ckpts: int, first: bool, last: bool,
                     tp_hidden: float) -> float:
    """A stage's tensor-parallel exchanges of one micro-batch (s): 4 per layer, 2 more per
    recomputed layer; the vocabulary-parallel embedding's all-reduce (``first`` stage); the
    head's loss exchanges (logits all-gather, or Megatron's three small all-reduces) and its
    input-gradient exchange (``last`` stage); minus the framework's overlap ``tp_hidden``."""
    if tp == 1:
        return 0.0
    t = ((4 * layers + 2 * ckpts) * c.tp_exchange + (c.tp_embedding if first else 0.0)
         + ((c.tp_head + c.tp_exchange) if last else 0.0))
    return t * (1.0 - tp_hidden)


def cp_exchange_seconds(model: Model, s: int, b: int, tp: int, cp: int, act_bytes: int,
                        hw: HardwareSpec, measured: Measured | None = None,
                        devices_per_node: int | None = None) -> float:
    """Seconds of one layer's context-parallel K/V exchange for one micro-batch (forward +
    backward), exposed: the cp ranks all-gather K and V (``2·b·s·kv_dim/tp`` elements in all)
    before the forward attention, again before the backward one, and reduce-scatter their
    gradients (Dubey et al. 2024 §3.3.2: Llama 3 all-gathers K and V, "exposed in the critical
    path"; torch's ``context_parallel`` rotates the same volume). On the intra-node link while
    ``cp·tp`` ranks fit a node (cp is the next dimension out from tp), else the inter-node
    one. FLOPs are unchanged by cp: every rank computes its ``s/cp`` queries against all keys."""
    if cp <= 1:
        return 0.0
    nbytes = 2 * b * s * model.kv_dim / tp * act_bytes
    per_node = devices_per_node or hw.devices_per_node
    link = hw.intra if (cp * tp <= per_node or hw.inter is None) else hw.inter
    return (2 * collective_time("all_gather", nbytes, cp, link, measured)
            + collective_time("reduce_scatter", nbytes, cp, link, measured))


def node_of(rank: int, devices_per_node: int) -> int:
    return rank // devices_per_node


def boundary_crosses_node(point: Point, stage: int, devices_per_node: int) -> bool:
    """Whether pipeline stage ``stage`` sends to stage ``stage + 1`` across nodes. Ranks are
    laid out tp fastest, then dp, then pp (Megatron's and DeepSpeed's topology, and
    ``scalestudy.distributed.mesh``): stage ``r`` holds ranks ``[r·k, (r+1)·k)``, ``k = tp·dp``,
    each sending to the rank ``k`` further on."""
    k = point.tp * int(point.dp)
    return any(node_of(x, devices_per_node) != node_of(x + k, devices_per_node)
               for x in range(stage * k, (stage + 1) * k))


def p2p_seconds(point: Point, stage: int, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Exposed pipeline transfers of one micro-batch on stage ``stage`` (seconds).

    Per neighbouring stage the framework's ``pp_transfers_per_neighbour`` serial transfers
    (activation out, gradient back) of ``b·s·h`` activations (``/tp`` with sequence
    parallelism or when the framework partitions them over TP, plus an intra-node all-gather
    over TP of each received tensor in that case), on the inter-node link where the boundary
    crosses nodes (``boundary_crosses_node``); ``v`` × that with ``v`` virtual stages; minus the
    framework's steady-state overlap (with interleaving only, where so declared)."""
    pp = point.pp
    if pp <= 1:
        return 0.0
    fw = hw.framework
    v = point.parallel.virtual_stages
    tp, sp = point.tp, point.parallel.sequence_parallel and point.tp > 1
    ab = ACT_BYTES[DType(point.train.precision) != DType.FP32]
    full = point.micro_batch * point.seq_len * point.model.hidden * ab
    split = sp or (fw.pp_partitioned and tp > 1)
    msg = full / tp if split else full
    t = 0.0
    for r in (stage - 1, stage):  # the boundaries r|r+1 this stage touches
        if r < 0 or r >= pp - 1:
            continue
        inter = boundary_crosses_node(point, r, hw.devices_per_node) and hw.inter is not None
        link = hw.inter if inter else hw.intra
        one = collective_time("send_recv", msg, 2, link, None if inter else measured)
        gather = (collective_time("all_gather", full, tp, hw.intra, measured)
                  if (fw.pp_partitioned and tp > 1 and not sp) else 0.0)
        t += fw.pp_transfers_per_neighbour * one + gather
    ov = fw.pp_overlap if (v > 1 or not fw.pp_overlap_needs_interleaving) else 0.0
    return v * t * (1.0 - ov)


def pipeline_seconds(slots: list[float], micro_batches: int, virtual: int = 1) -> tuple[float, float]:
    """``(pipeline_s, bubble_s)`` of a 1F1B (or GPipe) schedule whose stage ``r`` takes
    ``slots[r]`` seconds per micro-batch (forward + backward + its communication): ``m``
    slots of the slowest stage plus the fill and drain, the other stages' slots once each
    (the latency of one micro-batch through the pipeline), divided by ``v`` when each rank
    holds ``v`` interleaved stages (Narayanan et al. SC21 §2.2: bubble ``(p-1)/(v·m)`` of the
    ideal time for equal stages). DeepSpeed's TrainSchedule: ``2·(m + p - 1)`` steps."""
    worst = max(slots)
    bubble = (sum(slots) - worst) / virtual
    return micro_batches * worst + bubble, bubble


def syncs_every_micro_batch(point: Point, fw: Framework) -> bool:
    """Whether the point's sharded data parallelism reduce-scatters every micro-batch's
    gradients (FSDP2's default, kept by frameworks that never disable the sync,
    ``Framework.fsdp_sync_every_micro_batch``) rather than accumulating them unsharded; not
    under pipeline stages, whose schedule disables the sync until the last backward
    (``torch.distributed.pipelining`` ``backward_maybe_with_nosync``)."""
    return (fw.fsdp_sync_every_micro_batch and point.pp == 1
            and point.parallel.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))


def dp_comm_seconds(point: Point, params: float, hw: HardwareSpec,
                    measured: Measured | None = None) -> tuple[float, float, str]:
    """``(per_step_s, per_micro_batch_s, link)`` of the data-parallel gradient traffic of a
    device holding ``params`` parameters (gradients at the activation width: 2 bytes in
    bf16/fp16). ``ddp``: one all-reduce; ``zero1``: reduce-scatter of the gradients and
    all-gather of the updated weights (same volume, Rajbhandari et al. 2020), or an all-reduce
    of the gradients and the all-gather where the framework reduces so
    (``Framework.zero1_all_reduce``: DeepSpeed's BF16_Optimizer); ``fsdp_grad_op``:
    reduce-scatter per step and an all-gather per micro-batch; ``fsdp``: two all-gathers per
    micro-batch (forward and backward); where the framework syncs every micro-batch
    (:func:`syncs_every_micro_batch`) the other ``m - 1`` micro-batches' reduce-scatters too,
    spread over the ``m`` micro-batches (the last one's is the step's). Ring costs
    (``collective_time``) on the inter-node link when ``tp·dp`` exceeds a node, at ``dp_members_per_node`` × the per-device NIC share:
    a ring that visits a group's members on one node in a row leaves the node once, so the
    ``devices_per_node / g`` groups of a node share its NICs."""
    dp = int(point.dp)
    if dp <= 1:
        return 0.0, 0.0, "intra"
    ab = ACT_BYTES[DType(point.train.precision) != DType.FP32]
    nbytes = params * ab
    inter = point.tp * dp > hw.devices_per_node and hw.inter is not None
    link = hw.intra
    if inter:
        link = hw.inter.scaled(hw.inter.bandwidth * dp_members_per_node(point, hw.devices_per_node))
    meas = None if inter else measured
    adj = point.tp == 1
    mode = point.parallel.dp_mode
    if mode == DPMode.DDP:
        return collective_time("all_reduce", nbytes, dp, link, meas, adj), 0.0, ("inter" if inter else "intra")
    rs = collective_time("reduce_scatter", nbytes, dp, link, meas, adj)
    ag = collective_time("all_gather", nbytes, dp, link, meas, adj)
    if mode == DPMode.ZERO1:
        if hw.framework.zero1_all_reduce:
            rs = collective_time("all_reduce", nbytes, dp, link, meas, adj)
        return rs + ag, 0.0, ("inter" if inter else "intra")
    gathers = 2 if mode == DPMode.FSDP else 1
    m = max(1, int(point.grad_accum))
    early = rs * (m - 1) / m if syncs_every_micro_batch(point, hw.framework) else 0.0
    return rs, gathers * ag + early, ("inter" if inter else "intra")


def dp_members_per_node(point: Point, devices_per_node: int) -> int:
    """Members of one data-parallel group on one node (ranks laid out tp fastest, then dp):
    ``devices_per_node / tp``, at most ``dp`` and at least 1."""
    return max(1, min(int(point.dp), devices_per_node // point.tp))


def dp_overlap_fraction(point: Point, hw: HardwareSpec, override: float | None = None) -> float:
    """The fraction of the DP traffic that may hide behind backward compute: ``override``
    when given; 0 on a CPU host (``compute_units``: gloo's copies run on the computing cores);
    else the framework's ``dp_overlap`` (no pipeline) or ``dp_overlap_pp``."""
    if override is not None:
        return float(override)
    if hw.compute_units:
        return 0.0
    return hw.framework.dp_overlap_pp if point.pp > 1 else hw.framework.dp_overlap


def dp_exposed_seconds(per_step: float, per_micro_batch: float, micro_batches: int,
                       overlap: float, backward_s: float, compute_s: float,
                       chunks: float | None = None) -> float:
    """Exposed DP seconds per step: the per-step reduction minus ``overlap`` × the backward
    of the last micro-batch (``backward_s``), never below one chunk (``per_step / chunks``)
    when the framework exposes one (Megatron-Core: a layer, or a virtual stage with PP); plus
    the per-micro-batch gathers minus ``overlap`` × that micro-batch's compute, ``m`` times."""
    step = max(0.0, per_step - overlap * backward_s)
    if chunks and overlap > 0:
        step = max(step, per_step / chunks)
    return step + micro_batches * max(0.0, per_micro_batch - overlap * compute_s)


def dp_step_exposed_seconds(point: Point, hw: HardwareSpec, t_dp_step: float, t_dp_mb: float,
                            ov: float, t_bwd_mb: float, t_comp: float) -> float:
    """The data-parallel communication left exposed (s): the per-step traffic ``t_dp_step``
    and per-micro-batch ``t_dp_mb`` under the overlap fraction ``ov`` of backward ``t_bwd_mb``
    and compute ``t_comp`` of one micro-batch."""
    fw, par = hw.framework, point.parallel
    pp, m = point.pp, max(1, int(point.grad_accum))
    v = par.virtual_stages if pp > 1 else 1
    chunks = (point.model.layers / pp if pp == 1 else v) if fw.dp_exposes_one_chunk else None
    # the distributed optimizer's parameter all-gather (half of zero1's per-step traffic) may
    # run under the next step's first forward instead (Megatron-Core --overlap-param-gather)
    gather = t_dp_step / 2 if (fw.dp_gather_overlap and par.dp_mode == DPMode.ZERO1) else 0.0
    return (dp_exposed_seconds(t_dp_step - gather, t_dp_mb, m, ov, t_bwd_mb, t_comp, chunks)
            + dp_exposed_seconds(gather, 0.0, m, ov, t_comp / 3, t_comp, chunks))


def tied_grad_seconds(point: Point, hw: HardwareSpec, grad_bytes: int,
                      measured: Measured | None = None) -> float:
    """Seconds of the tied word embedding's gradient all-reduce between the first and the last
    pipeline stage (each holds a copy): ``vocab · hidden / tp`` elements of ``grad_bytes``
    among 2 ranks, once per step after the flush and before the data-parallel reduction, not
    overlapped (DeepSpeed's ``ReduceTiedGrads``: ``dist.all_reduce(weight._hp_grad or
    weight.grad, group)``; Megatron-LM: ``all_reduce(word_embeddings_weight.grad,
    group=mpu.get_embedding_group())``). Every device of the first stage exchanges with its
    peer ``(pp - 1)·tp·dp`` ranks further on, across nodes when the two are on different nodes
    (ranks laid out tp, then dp, then pp). 0 without pipeline stages, tied embeddings or a
    framework that does it (``Framework.tied_grad_all_reduce``)."""
    model, pp = point.model, point.pp
    if pp <= 1 or not model.tied_embeddings or not hw.framework.tied_grad_all_reduce:
        return 0.0
    k = point.tp * int(point.dp)
    far = (pp - 1) * k
    cross = hw.inter is not None and any(
        node_of(x, hw.devices_per_node) != node_of(x + far, hw.devices_per_node)
        for x in range(k))
    nbytes = model.vocab * model.hidden / point.tp * grad_bytes
    return collective_time("all_reduce", nbytes, 2, hw.inter if cross else hw.intra,
                           None if cross else measured, adjacent=far == 1)


def clip_seconds(point: Point, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds of gradient clipping's all-reduce of the squared norm (4 bytes among all
    ``n`` ranks on the intra-node link), where clipping is on and the gradients are sharded
    (tensor or pipeline parallelism, or FSDP over data-parallel ranks); else 0."""
    par, tp, pp, dp = point.parallel, point.tp, point.pp, int(point.dp)
    sharded = tp > 1 or pp > 1 or (dp > 1 and par.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))
    return (collective_time("all_reduce", 4, point.n, hw.intra, measured)
            if point.train.grad_clip and sharded else 0.0)
