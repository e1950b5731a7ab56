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
  overlap (``dp_comm_seconds`` / ``dp_step_exposed_seconds``; on a GPU, FSDP per block with
  its prefetch, ``fsdp_layer_seconds``), in the framework's reduction width and buckets
  (``dp_widths``, ``dp_buckets``), and before it the tied embedding's gradient all-reduce
  between the first and the last pipeline stage (``tied_grad_seconds``); gradient clipping's
  norm all-reduce (``clip_seconds``).

Ring collectives cost ``rates.collective_time``: the system's links (on a GPU system with its
collective library's ring latency, which grows with the ranks and the nodes a ring spans), or
the measured fits. A CPU host's side is frozen (docs/performance-model.md, The CPU study): its
DP traffic keeps the activation width, one collective per reduction and whole-model FSDP
gathers.
"""

from __future__ import annotations

import math

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.vocab import DPMode, DType
from scalestudy.perf.hardware import HardwareSpec, Link
from scalestudy.perf.framework import Framework
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
    local = cp * tp <= per_node or hw.inter is None
    link = hw.intra if local else hw.inter
    nodes = 1 if local else math.ceil(cp / max(1, per_node // tp))
    return (2 * collective_time("all_gather", nbytes, cp, link, measured, nodes=nodes)
            + collective_time("reduce_scatter", nbytes, cp, link, measured, nodes=nodes))


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


def dp_widths(point: Point, hw: HardwareSpec) -> tuple[int, int]:
    """``(gradient, parameter)`` bytes per element of the data-parallel traffic: gradients
    reduced at the framework's ``grad_reduce_bytes`` (never below the training precision's
    width), parameters gathered at the training precision's width (16-bit parameters: 2;
    ``hardware.yaml`` frameworks, with their sources). On a CPU host (``compute_units``) both
    stay at the activation width: its side of the model is frozen."""
    act = ACT_BYTES[DType(point.train.precision) != DType.FP32]
    if hw.compute_units:
        return act, act
    return max(hw.framework.grad_reduce_bytes or act, act), act


def dp_buckets(point: Point, params: float, hw: HardwareSpec) -> int:
    """Collectives one data-parallel reduction of ``params`` parameters is split into, each
    paying its own latency: ``⌈params / bucket⌉``, ``bucket = max(dp_bucket_params,
    dp_bucket_params_per_rank · dp)`` (PyTorch DDP's 25 MiB, DeepSpeed's 5e8 elements,
    Megatron-Core's ``max(4e7, 1e6 · dp)``); 1 where the framework reduces the stage's
    gradients in one collective, and on a CPU host (frozen)."""
    fw = hw.framework
    if hw.compute_units or not fw.dp_bucket_params:
        return 1
    size = max(fw.dp_bucket_params, fw.dp_bucket_params_per_rank * int(point.dp))
    return max(1, math.ceil(params / size))


def dp_ring(point: Point, hw: HardwareSpec,
            measured: Measured | None = None) -> tuple[Link, int, Measured | None, str]:
    """``(link, nodes, measured, name)`` of a data-parallel group's ring: the intra-node link
    while ``tp·dp`` ranks fit a node, else the inter-node one at ``dp_members_per_node`` × the
    per-device NIC share (a ring that visits a group's members on one node in a row leaves the
    node once, so the ``devices_per_node / g`` groups of a node share its NICs) over
    ``⌈dp / g⌉`` nodes; the measured fits only within a node."""
    dp = int(point.dp)
    if point.tp * dp <= hw.devices_per_node or hw.inter is None:
        return hw.intra, 1, measured, "intra"
    g = dp_members_per_node(point, hw.devices_per_node)
    return hw.inter.scaled(hw.inter.bandwidth * g), math.ceil(dp / g), None, "inter"


def dp_comm_seconds(point: Point, params: float, hw: HardwareSpec,
                    measured: Measured | None = None) -> tuple[float, float, str]:
    """``(per_step_s, per_micro_batch_s, link)`` of the data-parallel traffic of a device
    holding ``params`` parameters, gradients and parameters at ``dp_widths``, each reduction
    in ``dp_buckets`` collectives. ``ddp``: one all-reduce; ``zero1``: reduce-scatter of the
    gradients and all-gather of the updated weights (Rajbhandari et al. 2020), or an
    all-reduce of the gradients and the all-gather where the framework reduces so
    (``Framework.zero1_all_reduce``: DeepSpeed's BF16_Optimizer). FSDP as whole-model traffic
    (the CPU host's accounting; a GPU prices it per block, :func:`fsdp_layer_seconds`):
    ``fsdp_grad_op`` a reduce-scatter per step and an all-gather per micro-batch, ``fsdp`` two
    all-gathers per micro-batch (forward and backward); where the framework syncs every
    micro-batch (:func:`syncs_every_micro_batch`) the other ``m - 1`` micro-batches'
    reduce-scatters too, spread over the ``m`` micro-batches (the last one's is the step's).
    Ring costs (``collective_time``) on the group's ring (:func:`dp_ring`)."""
    dp = int(point.dp)
    if dp <= 1:
        return 0.0, 0.0, "intra"
    link, nodes, meas, where = dp_ring(point, hw, measured)
    grad_b, param_b = dp_widths(point, hw)
    k = dp_buckets(point, params, hw)
    adj = point.tp == 1

    def coll(op: str, width: int) -> float:
        return k * collective_time(op, params * width / k, dp, link, meas, adj, nodes)

    mode = point.parallel.dp_mode
    if mode == DPMode.DDP:
        return coll("all_reduce", grad_b), 0.0, where
    rs = coll("reduce_scatter", grad_b)
    ag = coll("all_gather", param_b)
    if mode == DPMode.ZERO1:
        if hw.framework.zero1_all_reduce:
            rs = coll("all_reduce", grad_b)
        return rs + ag, 0.0, where
    gathers = 2 if mode == DPMode.FSDP else 1
    m = max(1, int(point.grad_accum))
    early = rs * (m - 1) / m if syncs_every_micro_batch(point, hw.framework) else 0.0
    return rs, gathers * ag + early, where


def fsdp_per_block(point: Point, hw: HardwareSpec) -> bool:
    """Whether the point's data parallelism is FSDP priced per block
    (:func:`fsdp_layer_seconds`): ``fsdp`` or ``fsdp_grad_op`` over ``dp > 1`` ranks on a GPU
    (a CPU host keeps its frozen whole-model accounting, :func:`dp_comm_seconds`)."""
    return (int(point.dp) > 1 and not hw.compute_units
            and point.parallel.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))


def fsdp_layer_seconds(point: Point, hw: HardwareSpec, layers: float, block_params: float,
                       root_params: float, fwd_s: float, bwd_s: float, overlap: float,
                       measured: Measured | None = None) -> tuple[float, float, str]:
    """``(traffic_s, exposed_s, link)`` per step of FSDP as FSDP2 runs it, per transformer
    block (``block_params`` per device each, ``layers`` of them on the stage) plus the root
    unit (``root_params``: embedding, final norm, head), each unit's all-gather (parameters)
    and reduce-scatter (gradients) one ring collective (:func:`dp_ring`, widths
    :func:`dp_widths`).

    The schedule (torch ``distributed/fsdp/_fully_shard``; torchtitan ``apply_fsdp``): the
    forward gathers the root and the first block exposed, then each next block's all-gather
    is prefetched under the current block's forward (``fwd_s`` per block: one block ahead,
    FSDP2's default "implicit prefetching"); the backward gathers the root again and, one
    block ahead, every block but the last (``reshard_after_forward=layer_id < L - 1``; ``fsdp``
    without pipeline stages only: ``fsdp_grad_op`` and pipelined FSDP keep the gathered
    parameters), while each block's reduce-scatter runs under the next block's backward
    (``bwd_s``); the first block's and the root's reduce-scatters stay exposed. Per block the
    exposed time is ``max(0, collectives - overlap · compute)``. Without pipeline stages every
    micro-batch gathers again (FSDP2 reshards after each backward); with them only the first
    (``torch.distributed.pipelining`` keeps the parameters until the last backward). Gradients
    are reduce-scattered every micro-batch where the framework syncs so
    (:func:`syncs_every_micro_batch`), else after the last one. So the bandwidth term per rank
    shrinks as ``(p-1)/p`` while each collective's ring latency grows with ``p`` and the
    nodes: throughput per device falls with N once a block's collectives stop hiding."""
    dp = int(point.dp)
    if dp <= 1:
        return 0.0, 0.0, "intra"
    link, nodes, meas, where = dp_ring(point, hw, measured)
    grad_b, param_b = dp_widths(point, hw)
    adj = point.tp == 1

    def coll(op: str, n: float, width: int) -> float:
        return collective_time(op, n * width, dp, link, meas, adj, nodes)

    ag, rs = coll("all_gather", block_params, param_b), coll("reduce_scatter", block_params, grad_b)
    ag0, rs0 = coll("all_gather", root_params, param_b), coll("reduce_scatter", root_params, grad_b)
    n_blocks = max(1, round(layers))
    m = max(1, int(point.grad_accum))
    regather = point.pp == 1 and point.parallel.dp_mode == DPMode.FSDP

    def hidden(comm: float, window: float) -> float:
        return max(0.0, comm - overlap * window)

    fwd = (ag0 + n_blocks * ag, ag0 + ag + (n_blocks - 1) * hidden(ag, fwd_s))

    def bwd(scatter: bool) -> tuple[float, float]:
        a, r = (ag if regather else 0.0), (rs if scatter else 0.0)
        # block L prefetches block L-1's gather, blocks L-1..2 also carry the previous
        # block's reduce-scatter, block 1 only that; then block 1's and the root's
        slots = (hidden(a, bwd_s) + (n_blocks - 2) * hidden(a + r, bwd_s) + hidden(r, bwd_s)
                 if n_blocks > 1 else 0.0)
        root_ag = ag0 if regather else 0.0
        tail = r + (rs0 if scatter else 0.0)
        return (root_ag + (n_blocks - 1) * a + n_blocks * r + (rs0 if scatter else 0.0),
                root_ag + slots + tail)

    gathering = m if point.pp == 1 else 1
    scattering = m if syncs_every_micro_batch(point, hw.framework) else 1
    (t_s, e_s), (t_n, e_n) = bwd(True), bwd(False)
    traffic = gathering * fwd[0] + scattering * t_s + (m - scattering) * t_n
    exposed = gathering * fwd[1] + scattering * e_s + (m - scattering) * e_n
    return traffic, exposed, where


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
    v = point.stages_per_rank
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
                           None if cross else measured, adjacent=far == 1,
                           nodes=2 if cross else 1)


def clip_seconds(point: Point, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds of gradient clipping's all-reduce of the squared norm (4 bytes among all
    ``n`` ranks), where clipping is on and the gradients are sharded (tensor or pipeline
    parallelism, or FSDP over data-parallel ranks); else 0. On a GPU system its library's
    least latency, ring or tree, over the nodes the ranks fill
    (``CollectiveLatency.scalar_all_reduce``: the bytes do not matter); else the measured fit
    or the intra-node link's ``collective_time``."""
    par, tp, pp, dp = point.parallel, point.tp, point.pp, int(point.dp)
    sharded = tp > 1 or pp > 1 or (dp > 1 and par.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))
    if not (point.train.grad_clip and sharded):
        return 0.0
    lib = hw.intra.library
    fit = measured.collective_time("all_reduce", 4, point.n) if measured is not None else None
    if lib is None or fit is not None:
        return collective_time("all_reduce", 4, point.n, hw.intra, measured)
    return lib.scalar_all_reduce(point.n, math.ceil(point.n / hw.devices_per_node))
