"""The step's compute terms, each a pure function with its units and source
(``docs/performance-model.md`` has the full table). Notation: micro-batch ``b`` sequences of
``s`` tokens, hidden ``h``, ``a`` heads, MLP width ``f``, vocabulary ``V``, ``l`` layers on
``pp`` stages (``v`` virtual stages each), ``tp`` / ``dp`` ranks, ``m`` micro-batches.

- ``gemm_s`` — dense products (q/k/v/o projections, MLP, output head: ``layer_gemms``,
  ``head_gemm``): forward, the two backward products and the recomputed forward, each at the
  device's GEMM ceiling times its tile/wave quantisation (``rates.product_seconds``), or at
  the rate measured for the nearest shape.
- ``attention_s`` — the attention core: a fused kernel at its published rate
  (``attention_seconds``, FlashAttention-2 FLOP count: causal half, backward 2.5 ×), or the
  ``Q Kᵀ`` / ``A V`` products at GEMM rates.
- ``elementwise_s`` — memory-bound kernels (norms, residual adds, activation, loss) at the
  device's bandwidth (``elementwise_bytes``, ``loss_bytes``).
- ``grad_accum_s`` — adding each micro-batch's gradients to the step's, memory-bound, as the
  framework does it (``grad_accumulation_seconds``).
- ``overhead_s`` — framework overhead per micro-batch (``overhead_seconds``, measured on a
  CPU host) and kernel-launch gaps on a GPU (``launch_gap_seconds``).
- ``optimizer_s`` — AdamW over the optimizer shard at memory bandwidth, plus its dispatch
  (``optimizer_seconds``, ``optimizer_step_seconds``).

``layer_costs`` evaluates one micro-batch's pieces on one TP rank (``LayerCosts``);
``stage_terms`` adds them up for a pipeline stage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.vocab import AttentionKernel, DPMode, DType
from scalestudy.perf import kernels
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.framework import Framework
from scalestudy.perf.rates import (ACT_BYTES, Measured, collective_time, elementwise_seconds,
                                   product_seconds)
from scalestudy.perf.terms_comm import tp_collective_seconds

#: AdamW with fp32 state: read weight, gradient, two moments (and the master copy), write them
#: back (bytes per parameter of the optimizer shard).
OPT_BYTES_TOUCHED = 28
#: FlashAttention-2's FLOP convention (Dao, arXiv:2307.08691 §4.1): a causal mask halves the
#: forward FLOPs ("With causal mask, we divide this number by 2") and the backward costs 2.5 ×
#: the forward ("backward pass FLOPs ... forward pass FLOPs by 2.5").
FA_CAUSAL_FRACTION = 0.5
FA_BACKWARD_FACTOR = 2.5


def layer_gemms(model: Model, s: int, b: int, tp: int = 1, attention_only: bool = False,
                fused_qkv: bool = False) -> list:
    """The forward matrix products of one layer on one TP rank as ``(M, N, K, count)``
    (``M×K`` times ``K×N``), as Megatron-style tensor parallelism splits them: q, k, v and
    the MLP's up (and gate) products column-parallel (``N`` divided by ``tp``), the attention
    output and MLP down products row-parallel (``K`` divided by ``tp``), and the attention
    core's ``Q Kᵀ`` and ``A V`` (``s × s × head_dim``, ``2·b·a/tp`` of them). ``fused_qkv``:
    q, k, v (and SwiGLU's gate and up) as one product (Megatron) instead of separate ones
    (``scalestudy.models.gpt``). FLOPs: ``2·M·N·K·count`` summed = ``flops.layer_forward_flops``."""
    h, f, a, kv = model.hidden, model.ffn, model.heads, model.kv_dim
    attn = [(s, s, model.head_dim, 2 * b * a / tp)]
    if attention_only:
        return attn
    bs = b * s
    up = model.mlp_matrices - 1  # GELU: 1 (up); SwiGLU: 2 (gate, up)
    # q is h wide, k and v kv_dim wide each (grouped-query attention: kv_heads · head_dim)
    qkv = ([(bs, (h + 2 * kv) / tp, h, 1)] if fused_qkv else
           [(bs, h / tp, h, 1), (bs, kv / tp, h, 2)])
    mlp_up = [(bs, up * f / tp, h, 1)] if (fused_qkv and up > 1) else [(bs, f / tp, h, up)]
    return qkv + [(bs, h, h / tp, 1)] + mlp_up + [(bs, h, f / tp, 1)] + attn


def head_gemm(model: Model, s: int, b: int, tp: int = 1) -> tuple:
    """The output head's forward product ``(b·s, V/tp, h, 1)`` (vocabulary-parallel)."""
    return (b * s, model.vocab / tp, model.hidden, 1)


def gemm_shapes(points) -> list[tuple[int, int, int]]:
    """The distinct forward matrix products ``(M, N, K)`` of the feasible points (per TP rank:
    projections, MLP, attention, head), for measuring them where the study runs
    (``scalestudy.measure.calibrate --shapes``)."""
    shapes = set()
    for p in points:
        if not p.feasible:
            continue
        model, tp, s, b = p.model, p.tp, p.seq_len, p.micro_batch
        for M, N, K, _ in layer_gemms(model, s, b, tp) + [head_gemm(model, s, b, tp)]:
            shapes.add((int(M), int(N), int(K)))
    return sorted(shapes)


def attention_seconds(model: Model, s: int, b: int, tp: int, dtype: str, hw: HardwareSpec,
                      measured: Measured | None = None) -> tuple[float, float, bool]:
    """``(forward_s, backward_s, measured?)`` of one layer's attention core on one TP rank.

    Measured: a fused-attention rate (``Measured.attention_rate``, Megatron's count
    ``4·s²·h/tp`` per sequence), else the ``Q Kᵀ`` / ``A V`` products at the nearest measured
    matmul rate; backward = 2 × forward. Declared, fused kernel (``model.attention == fused``
    and the system declares ``attention.efficiency``): FlashAttention-2's count, the causal
    forward ``0.5 · 4·b·s²·h/tp`` and the backward ``2.5 ×`` that (Dao, arXiv:2307.08691
    §4.1), at ``attention_efficiency × peak``. Otherwise the products at ``gemm_seconds``."""
    head = model.head_dim
    if measured is not None:
        r = measured.attention_rate(dtype, s, head)
        if r:
            fwd = 4.0 * b * s * s * model.hidden / tp / r
            return fwd, 2.0 * fwd, True
    (M, N, K, count), = layer_gemms(model, s, b, tp, attention_only=True)
    r = measured.matmul_rate(dtype, M, N, K) if measured is not None else None
    if r:
        fwd = 2.0 * M * N * K * count / r
        return fwd, 2.0 * fwd, True
    if model.attention == AttentionKernel.FUSED and hw.attention_efficiency:
        fwd_flops = FA_CAUSAL_FRACTION * 4.0 * b * s * s * model.hidden / tp
        rate = hw.attention_efficiency * hw.sustained * hw.power_factor * hw.peak(dtype)
        return fwd_flops / rate, FA_BACKWARD_FACTOR * fwd_flops / rate, False
    # math attention: the scores' products are batched over heads and sequences (one
    # strided-batched launch each), plus the softmax over the s x s scores (memory-bound)
    fwd, bwd, _ = product_seconds(M, N, K, count, dtype, hw, batched=True)
    heads = count / 2  # (b·a/tp) score matrices of s x s
    ab = ACT_BYTES[DType(dtype) != DType.FP32]
    e_fwd, e_bwd = kernels.softmax_elements(hw.framework.fusion, hw.framework.dropout)
    soft_fwd = elementwise_seconds(e_fwd * heads * s * s * ab, hw, measured)
    soft_bwd = elementwise_seconds(e_bwd * heads * s * s * ab, hw, measured)
    return fwd + soft_fwd, bwd + soft_bwd, False


def elementwise_bytes(model: Model, s: int, b: int, act_bytes: int, tp: int = 1,
                      sp: bool = False, fusion: str = "eager", dropout: bool = False,
                      bias_add: bool = False) -> float:
    """Memory traffic of one layer's memory-bound kernels, forward + backward, on one TP rank
    (bytes): the inventory of ``scalestudy.perf.kernels`` for the model's architecture and the
    framework's fusion level (GPT: two LayerNorms, two residual adds, the attention output
    relayout and GELU, ``12h + 2f`` elements per token forward; Llama adds RMSNorm's fp32
    steps, rotary embeddings and SwiGLU), the backward twice the forward."""
    return kernels.layer_traffic(model, fusion, tp, sp, dropout, bias_add) * s * b * act_bytes


def loss_bytes(s: int, b: int, vocab: int, tp: int = 1, fusion: str = "fused",
               act_bytes: int = 4) -> float:
    """Memory traffic of the log-softmax / cross-entropy over ``b·s·V/tp`` logits and its
    backward (bytes; ``kernels.loss_bytes_per_logit``)."""
    return kernels.loss_bytes_per_logit(fusion, act_bytes) * b * s * vocab / tp


def fusion_of(point: Point, fw: Framework) -> str:
    """The fusion level a point's memory-bound kernels run at: the framework's, or
    ``compiled`` when an eager framework compiles the model (``train.compile``)."""
    return "compiled" if (fw.fusion == "eager" and point.train.compile) else fw.fusion


@dataclass(frozen=True)
class LayerCosts:
    """Seconds of one micro-batch's pieces on one TP rank (``layer_costs``): per layer the
    dense products forward / backward, the attention core forward / backward, the memory-bound
    kernels (forward + backward; the forward is a third), one TP exchange; the head's product
    forward / backward, its loss kernels, the embedding's and the head's TP exchanges (the
    logits all-gathered, or with a vocabulary-parallel loss three all-reduces of ``b·s`` fp32
    values: Megatron's ``vocab_parallel_cross_entropy``)."""

    gemm_fwd: float
    gemm_bwd: float
    attn_fwd: float
    attn_bwd: float
    elementwise: float
    tp_exchange: float
    head_fwd: float
    head_bwd: float
    loss: float
    tp_embedding: float
    tp_head: float
    measured: bool
    launches_fwd: float = 0.0
    launches_bwd: float = 0.0


def layer_costs(point: Point, hw: HardwareSpec, measured: Measured | None) -> LayerCosts:
    """One micro-batch's pieces on one TP rank of ``point`` (``LayerCosts``), at the measured
    rates where ``measured`` has them, else the declared ones."""
    model, tp = point.model, point.tp
    b, s = point.micro_batch, model.seq_len
    sp = point.parallel.sequence_parallel and tp > 1
    dtype = DType(point.train.precision)
    ab = ACT_BYTES[dtype != DType.FP32]
    fw = hw.framework
    fusion = fusion_of(point, fw)
    g_fwd = g_bwd = 0.0
    sources = set()
    dense = layer_gemms(model, s, b, tp, fused_qkv=fw.fused_qkv)[:-1]
    for M, N, K, count in dense:
        f_, b_, meas = product_seconds(M, N, K, count, dtype, hw, measured)
        g_fwd, g_bwd = g_fwd + f_, g_bwd + b_
        sources.add(meas)
    elem_launches = sum(n for _, _, n in kernels.layer_kernels(model, fusion, tp, sp,
                                                               fw.dropout, fw.bias_add))
    gemm_launches = sum(c for *_, c in dense)
    a_fwd, a_bwd, meas = attention_seconds(model, s, b, tp, dtype, hw, measured)
    sources.add(meas)
    h_fwd, h_bwd, meas = product_seconds(*head_gemm(model, s, b, tp), dtype, hw, measured)
    sources.add(meas)
    act = b * s * model.hidden * ab
    per = tp_collective_seconds(act, tp, hw, sp, measured)
    return LayerCosts(
        gemm_fwd=g_fwd, gemm_bwd=g_bwd, attn_fwd=a_fwd, attn_bwd=a_bwd,
        elementwise=elementwise_seconds(
            elementwise_bytes(model, s, b, ab, tp, sp, fusion, fw.dropout, fw.bias_add), hw,
            measured),
        tp_exchange=per, head_fwd=h_fwd, head_bwd=h_bwd,
        loss=elementwise_seconds(loss_bytes(s, b, model.vocab, tp, fusion, ab), hw, measured),
        tp_embedding=collective_time("all_reduce", act, tp, hw.intra, measured),
        tp_head=(3 * collective_time("all_reduce", b * s * 4, tp, hw.intra, measured)
                 if fw.vocab_parallel_loss else
                 collective_time("all_gather", b * s * model.vocab * ab, tp, hw.intra, measured)),
        measured=True in sources,
        launches_fwd=gemm_launches + 1 + elem_launches,
        launches_bwd=2 * gemm_launches + 1 + kernels.BACKWARD_LAUNCHES * elem_launches)


def cp_local(costs: LayerCosts, cp: int) -> LayerCosts:
    """One cp rank's share of a micro-batch's costs: ``s/cp`` tokens of every sequence, so
    every per-token cost (products, the load-balanced causal attention, memory-bound
    kernels, TP exchanges, the head and its loss) divided by ``cp`` (the shorter products'
    efficiency is not re-evaluated)."""
    if cp <= 1:
        return costs
    return dataclasses.replace(costs, **{f.name: getattr(costs, f.name) / cp
                                         for f in fields(costs) if f.name != "measured"})


def stage_terms(c, layers: int, ckpts: int, att_re: float, last: bool
                ) -> tuple[float, float, float]:
    """(gemm, attention, elementwise) seconds of one micro-batch on a stage of ``layers``
    layers, ``ckpts`` of them recomputed: every layer forward + backward, the recomputed
    layers' forward again (``att_re``: the attention recomputed in every layer), the head on
    the ``last`` stage. ``c``: the layer costs."""
    gemm = layers * (c.gemm_fwd + c.gemm_bwd) + ckpts * c.gemm_fwd
    attn = layers * (c.attn_fwd + c.attn_bwd + att_re) + ckpts * c.attn_fwd
    elem = layers * c.elementwise + ckpts * c.elementwise / 3
    if last:
        gemm, elem = gemm + c.head_fwd + c.head_bwd, elem + c.loss
    return gemm, attn, elem


#: Launches of the output head and its loss per micro-batch: the head's product forward and
#: its two backward products, and the loss kernels (upcast, log-softmax, its backward, cast).
HEAD_LAUNCHES = 3 + 4


def launch_gap_seconds(c: LayerCosts, layers: float, recomputed: float, last: bool,
                       hw: HardwareSpec) -> float:
    """GPU stream idle time of one micro-batch on a stage (seconds): every kernel launch
    (forward and backward of ``layers`` layers, the forward again of ``recomputed`` ones, the
    head and loss on the last stage) costs ``hw.kernel_gap_s``; 0 where none is declared (a
    CPU host, whose dispatch is measured as ``overhead``)."""
    if not hw.kernel_gap_s:
        return 0.0
    n = layers * (c.launches_fwd + c.launches_bwd) + recomputed * c.launches_fwd
    return hw.kernel_gap_s * (n + (HEAD_LAUNCHES if last else 0))


def overhead_seconds(overhead: dict, phase: str, layers: float, tp: int) -> float:
    """Framework overhead of ``phase`` (``fwd_bwd`` per micro-batch, ``optimizer`` per step)
    for a stage of ``layers`` layers: ``fixed + per_layer · layers`` (seconds), measured by
    ``microbench overhead`` (``tp_`` figures: under DTensor, used when ``tp > 1``)."""
    pre = "tp_" if tp > 1 and "tp_fwd_bwd_fixed_s" in overhead else ""
    return (overhead.get(f"{pre}{phase}_fixed_s", 0.0)
            + overhead.get(f"{pre}{phase}_per_layer_s", 0.0) * layers)


def grad_bytes_of(point: Point, fw: Framework) -> int:
    """Bytes per element of the gradients the backward produces under ``fw``: its
    ``grad_bytes`` where it states one (parameters kept in fp32 under autocast), else the
    training precision's width (16-bit parameters, 4 in fp32)."""
    return fw.grad_bytes or ACT_BYTES[DType(point.train.precision) != DType.FP32]


def grad_accumulation_seconds(params: float, micro_batches: int, mode: str, grad_bytes: int,
                              hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds per step a stage holding ``params`` parameters spends adding each
    micro-batch's gradients to the step's, memory-bound (:func:`elementwise_seconds`): the
    bytes per parameter of ``kernels.grad_accumulation_bytes(mode, grad_bytes)`` for the first
    micro-batch and for each of the other ``micro_batches - 1``. It runs after (or inside)
    each backward on the stage's stream: on its micro-batch slot."""
    per, first = kernels.grad_accumulation_bytes(mode, grad_bytes)
    nbytes = (first + per * max(0, micro_batches - 1)) * params
    return elementwise_seconds(nbytes, hw, measured) if nbytes else 0.0


def optimizer_seconds(params: float, hw: HardwareSpec, overhead_s: float = 0.0,
                      clip_s: float = 0.0, measured: Measured | None = None) -> float:
    """AdamW over ``params`` parameters (the optimizer shard): ``OPT_BYTES_TOUCHED`` bytes each,
    memory-bound (:func:`elementwise_seconds`: the measured copy bandwidth, else ``mem_bw ·
    mem_bw_efficiency``), plus its measured dispatch overhead and the gradient-clipping
    all-reduce (seconds)."""
    return elementwise_seconds(OPT_BYTES_TOUCHED * params, hw, measured) + overhead_s + clip_s


def tensor_sync_seconds(tensors: float, hw: HardwareSpec) -> float:
    """Seconds per step a device holding ``tensors`` parameter tensors spends in the
    framework's per-tensor checks that read a value back to the host (``Framework.
    tensor_syncs`` round trips at ``hw.host_sync_s`` and ``tensor_sync_launches`` kernels at
    ``hw.kernel_gap_s`` per tensor: Megatron-LM v1's fp16 overflow check and gradient-norm
    clipping, one tensor at a time); the GPU idles meanwhile, so no software rate applies."""
    fw = hw.framework
    return tensors * (fw.tensor_syncs * hw.host_sync_s + fw.tensor_sync_launches * hw.kernel_gap_s)


def rng_state_seconds(layers: float, recomputed: float, hw: HardwareSpec) -> float:
    """Seconds per micro-batch a stage of ``layers`` layers (``recomputed`` of them
    checkpointed) spends copying the CUDA generator's state to or from the host
    (``Framework.rng_state_copies`` per layer, ``rng_state_copies_checkpointed`` more per
    recomputed layer; each a synchronous copy of ``rng_state_bytes``: ``host_sync_s`` plus
    the bytes over the host link, where the system declares one). The GPU idles meanwhile, so
    no software rate applies."""
    fw = hw.framework
    if not fw.rng_state_bytes:
        return 0.0
    copy = hw.host_sync_s + (fw.rng_state_bytes / hw.host_bandwidth if hw.host_bandwidth else 0.0)
    return (fw.rng_state_copies * layers + fw.rng_state_copies_checkpointed * recomputed) * copy


def optimizer_step_seconds(point: Point, params: float, hw: HardwareSpec, overhead: dict,
                           measured: Measured | None = None) -> float:
    """The optimizer's compute of one step (seconds): AdamW over its shard (``params``, the
    largest stage's parameters, divided over the data-parallel ranks unless ddp) and its
    dispatch overhead for the stage's layers (``overhead``: the overhead table)."""
    par, tp, pp, dp = point.parallel, point.tp, point.pp, int(point.dp)
    opt_params = params / (dp if par.dp_mode != DPMode.DDP else 1)
    lps = point.model.layers / pp
    return optimizer_seconds(opt_params, hw, overhead_seconds(overhead, "optimizer", lps, tp),
                             0.0, measured)
