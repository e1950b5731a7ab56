"""Per-device memory estimate of one training point. Pure functions; all results in bytes.

``estimate(point)`` returns the bytes held by the *most loaded* device of the point (the
pipeline stage with the largest total), split by component:

- ``weights`` — the compute copy of the parameters (4 B/param in fp32, 2 B in bf16/fp16).
- ``gradients`` — one gradient per parameter in the compute dtype.
- ``optimizer`` — AdamW's two fp32 moments (8 B/param) plus an fp32 master copy (4 B/param)
  when training in 16-bit: the usual mixed-precision total is 2 + 2 + 12 = 16 B/param
  (Rajbhandari et al. 2020, ZeRO §3), the same 16 B/param as plain fp32 (4 + 4 + 8).
- ``comm_buffers`` — DDP's gradient buckets (a second copy of the gradients: PyTorch DDP's
  default ``gradient_as_bucket_view=False``) for ``ddp`` and ``zero1`` (which is DDP's
  all-reduce + ``ZeroRedundancyOptimizer`` in ``scalestudy.distributed.engine``) with dp > 1.
  Megatron's contiguous gradient buffer does not have this copy.
- ``activations`` — what the forward pass keeps for the backward pass, times the
  micro-batches the pipeline schedule holds in flight (below).
- ``logits`` — the output head's logits and the fp32 log-softmax of the loss (last stage).

Sharding over the data-parallel group (``dp_mode``):

| dp_mode        | weights            | gradients | optimizer |
|----------------|--------------------|-----------|-----------|
| ddp            | full               | full                | full      |
| zero1          | full               | full                | / dp      |
| fsdp_grad_op   | full + shard / dp  | / dp + 2 units      | / dp      |
| fsdp           | / dp + root + 2 layers | / dp + 2 units  | / dp      |

(FSDP2 units are the layers and the root, i.e. what a stage holds besides its layers:
embeddings, final norm, head. ``fsdp_grad_op`` is ``reshard_after_forward=False``: the
gathered weights stay resident between forward and backward on top of the persistent shard;
``fsdp`` (ZeRO-3) holds the shard plus the gathered root and the layer being computed and
the prefetched next one. Gradients: the shard plus the unsharded gradient of the largest
unit and its reduce-scatter input.) Tensor parallelism divides the layers' matrices, the vocabulary-parallel
embedding and the output head by ``tp``; norms and the row-parallel biases are replicated.
Pipeline parallelism gives each rank the layers of its stages under the point's
``parallel.pp_partition`` (``scalestudy.config.partition``: ``layers / pp`` when uniform), the
embeddings to the first and the final norm + output head to the last (with tied embeddings
and pp > 1 the last stage holds its own copy of the table, as Megatron does); every rank is
evaluated at its own layers and the most loaded one is reported. Context parallelism keeps the
parameters whole and shards ``dp_mode``'s state over dp·cp (the ranks that average
gradients).

Activations per layer and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", §4), in 16-bit units:
``s·b·h·(34 + 5·a·s/h)`` bytes without parallelism, where 34 = 4 (two LayerNorm inputs)
+ 11 (attention) + 19 (MLP: ``3 + 4f/h`` for a GELU MLP of width ``f``). Two of the 34 are
the 1-byte dropout masks after the attention and the MLP (``s·b·h`` each); the models here
have no dropout (neither has Llama 3), so a layer keeps ``32``: attention 10, MLP ``2 +
4f/h``; SwiGLU keeps its two input products and the down projection's input, ``2 + 6f/h``
(``scalestudy.models.gpt.SwiGLU`` recomputes ``silu`` in the backward pass, as Megatron-LM's
fused ``bias_swiglu``; autograd would keep ``silu`` and the product too, ``2 + 8f/h``).
Grouped-query attention keeps K and V (2 units each) at ``kv_heads/heads`` of their size:
attention is ``10 - 4·(1 - kv/a)`` units (the rotary embedding keeps nothing: its tables are constants; RMSNorm keeps its
input like LayerNorm). Its weights shrink the same way: ``wk`` and ``wv`` are ``h × kv_dim``
(``scalestudy.config.flops.layer_params``). The ``5·a·s/h`` term is the ``s × s``
score/softmax/dropout storage of unfused attention; a fused kernel (FlashAttention, PyTorch
SDPA flash / memory-efficient / CPU-flash) keeps only ``O(s)`` statistics and the term
vanishes (``model.attention``: ``fused`` (default) or ``math``). With tensor parallelism
``tp = t``: ``s·b·h·(10 + (u - 10)/t + 5·a·s/(h·t))`` for ``u`` units (``10 + 24/t``
in Korthikanti's dropout form: the norms' and the projections' inputs, 10 units, stay whole);
with sequence parallelism everything is divided by ``t``; with context parallelism ``cp``
every rank holds ``s/cp`` tokens of each sequence (Dubey et al. 2024 §3.3.2; its ring or
all-gathered K and V are transient). Checkpointing, as ``scalestudy.distributed.engine`` runs it: ``full`` keeps only each
layer's input, ``2·s·b·h`` (``/t`` with SP), plus the full activations of the one layer
being recomputed; ``selective`` (torchtitan's layer-selective) does that for every other
layer (global index 0, 2, 4, ...) and keeps everything of the others;
``selective_attention`` (Megatron's, Korthikanti §5, not a trainer mode) recomputes the
attention core only, dropping the ``5·a·s/h`` term. Units scale with the activation dtype
(×2 for fp32).

In-flight micro-batches on pipeline stage ``r`` of ``p`` with ``m`` micro-batches
(``grad_accum``) and ``v`` virtual stages: no PP or plain gradient accumulation: 1;
GPipe: ``m``; 1F1B: ``min(p - r, m)``; interleaved 1F1B (Megatron's warm-up,
``2·(p - r - 1) + (v - 1)·p + 1`` model chunks of ``layers/(p·v)`` layers, at most ``m·v``):
for stage 0 that is ``L·(1 + (p-1)/(p·v))`` layers' worth (Korthikanti §4.2.3).

Not counted: framework workspace (cuBLAS/NCCL buffers, allocator fragmentation, the CUDA
context), optimizer temporaries, collective staging buffers (context parallelism's gathered K
and V of one layer), Megatron's distribution of checkpointed inputs over the TP ranks
(``--distribute-checkpointed-activations``; the estimate errs high there). ``fits`` leaves
headroom for them (the planner: 10% of the device's memory).

Checked against published layouts (``data/published_layouts.csv``, ``tests/unit/test_memory.py``):
OPT-175B (992 A100 80GB), BLOOM-176B (384 A100 80GB, 5/6 x 10/5 layers on 12 stages), Llama 3
405B at 8K tokens (8,192 and 16,384 H100 80GB, no checkpointing, 7/8 x 14/7 layers on 16
stages) and at 128K with CP 16, Korthikanti et al.'s 175B with sequence parallelism and
selective recomputation all fit; their 175B without recomputation does not, as they report.
"""

from __future__ import annotations

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.vocab import (Arch, AttentionKernel, Checkpointing, DPMode, DType, MLPKind,
                                     PPSchedule, member)
from scalestudy.config import partition
from scalestudy.config.flops import layer_params, norm_params, position_params

GiB = 2**30
TiB = 2**40

COMPONENTS = ("weights", "gradients", "optimizer", "comm_buffers", "activations", "logits")


def is_16bit(precision: str) -> bool:
    """True for 16-bit compute (bf16, fp16), False for fp32."""
    return member(DType, precision, "train.precision") != DType.FP32


def stage_params(model: Model, tp: int, pp: int, stage: int,
                 layers: float | None = None) -> float:
    """Parameters held by one device of pipeline rank ``stage`` (0-based) under ``tp``:
    ``layers`` transformer layers (None: ``model.layers / pp``), the embeddings on the first
    rank, the final norm and the head on the last."""
    h, V, l = model.hidden, model.vocab, model.layers
    lp = layer_params(model, tp)
    n = (l / pp if layers is None else layers) * (lp["sharded"] + lp["replicated"])
    if stage == 0:
        n += V * h / tp + position_params(model)
    if stage == pp - 1:
        n += norm_params(model)  # final norm
        if not model.tied_embeddings or pp > 1:
            n += V * h / tp
    return n


def stage_param_tensors(model: Model, pp: int, stage: int, layers: float | None = None,
                        fused_qkv: bool = False) -> float:
    """Parameter tensors held by one device of pipeline rank ``stage`` (a TP rank holds a
    shard of each): per layer the linear layers' weights (q, k, v, or one fused q/k/v; the
    attention output; the MLP's up, SwiGLU's gate unless fused with it, and down) and, with
    biases, as many biases; two norms (a weight, and LayerNorm's bias); the token (and gpt's
    position) embeddings on the first rank; the final norm and an untied head on the last."""
    up = model.mlp_matrices - 1
    linear = (1 if fused_qkv else 3) + 1 + (1 if fused_qkv else up) + 1
    norm = 2 if (model.bias and model.arch == Arch.GPT) else 1
    n = (model.layers / pp if layers is None else layers) * (
        linear * (2 if model.bias else 1) + 2 * norm)
    if stage == 0:
        n += 2 if model.arch == Arch.GPT else 1
    if stage == pp - 1:
        n += norm + (1 if (not model.tied_embeddings or pp > 1) else 0)
    return n


def in_flight(schedule: str, pp: int, micro_batches: int, stage: int, virtual: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak, in units of one
    micro-batch through all of that device's layers (see module doc)."""
    m = max(1, int(micro_batches))
    if pp <= 1:
        return 1.0
    schedule = member(PPSchedule, schedule, "parallel.pp_schedule")
    if schedule == PPSchedule.GPIPE:
        return float(m)
    if schedule == PPSchedule.ONE_F_ONE_B or virtual <= 1:
        return float(min(pp - stage, m))
    chunks = 2 * (pp - stage - 1) + (virtual - 1) * pp + 1
    return min(chunks, m * virtual) / virtual


def checkpointed_layers(layers: int, pp: int, stage: int, virtual: int, ckpt: str,
                        counts: tuple | list | None = None) -> int:
    """How many of pipeline rank ``stage``'s layers are fully checkpointed: all under
    ``full``; under ``selective`` those with an even global index (rank ``stage`` holds
    model chunks ``stage, stage + pp, ...``; ``counts``: the layers of every chunk in stage
    order, ``scalestudy.config.partition.stage_layers``; None: ``layers / (pp·virtual)``
    each)."""
    ckpt = member(Checkpointing, ckpt, "parallel.activation_checkpointing")
    if counts is None:
        counts = (layers // (pp * virtual),) * (pp * virtual)
    chunks = [stage + c * pp for c in range(virtual)]
    if ckpt == Checkpointing.FULL:
        return sum(counts[k] for k in chunks)
    if ckpt != Checkpointing.SELECTIVE:
        return 0

    def evens_below(x: int) -> int:  # even integers in [0, x): counted, not enumerated
        return (x + 1) // 2

    starts = [sum(counts[:k]) for k in chunks]
    return sum(evens_below(a + counts[k]) - evens_below(a) for a, k in zip(starts, chunks))


def layer_activation_bytes(point: Point, tp: int | None = None,
                           attention: AttentionKernel | None = None) -> float:
    """Bytes one micro-batch leaves stored in one transformer layer (module doc formulas),
    before checkpointing is applied. ``attention`` overrides the model's kernel."""
    model, par = point.model, point.parallel
    s, b, h, a = model.seq_len / point.cp, point.micro_batch, model.hidden, model.heads
    t = point.tp if tp is None else tp
    mlp_units = 2 + (6 if model.mlp == MLPKind.SWIGLU else 4) * model.ffn / h
    # attention's 10: K and V (2 units each) shrink to kv_heads/heads under GQA
    attn_units = 10 - 4 * (1 - model.n_kv_heads / a)
    units = 4 + attn_units + mlp_units  # 32 for GELU 4h (Korthikanti's 34 less two masks)
    fused = (attention or model.attention) == AttentionKernel.FUSED
    score = 0.0 if fused else 5.0 * a * s / h
    if par.sequence_parallel and t > 1:
        u = (units + score) / t
    else:
        u = 10 + (units - 10) / t + score / t
    scale = (2 if is_16bit(point.train.precision) else 4) / 2
    return s * b * h * u * scale


def estimate(point: Point) -> dict:
    """Bytes per device by component for the most loaded pipeline stage, plus
    ``total_bytes``, ``stage`` (which stage), ``params_per_device`` and ``per_stage`` (the
    totals of every stage). The layers must split into the point's stages
    (``scalestudy.config.partition``): ValueError otherwise; the other rules are the caller's
    (``scalestudy.plan.constraints``)."""
    reason = partition.problem(point)
    if reason:
        raise ValueError(f"memory estimate: {reason}")
    model, par = point.model, point.parallel
    tp, pp, cp = point.tp, point.pp, point.cp
    dp = int(point.dp) * cp  # the parameters' replicas: dp_mode shards over dp·cp
    dp_mode, ckpt = par.dp_mode, par.activation_checkpointing
    virtual = point.stages_per_rank
    layers = model.layers
    half = is_16bit(point.train.precision)
    wb = 2 if half else 4  # compute weights / grads / activations
    ob = 8 + (4 if half else 0)  # AdamW moments (+ fp32 master)
    s, b, h, V = model.seq_len // cp, point.micro_batch, model.hidden, model.vocab
    m = max(1, int(point.grad_accum))
    counts = partition.stage_layers(point)
    rank_layers = partition.rank_layers(point)

    lp = layer_params(model, tp)
    one_layer = lp["sharded"] + lp["replicated"]
    per_layer_act = layer_activation_bytes(point, tp)
    sp = par.sequence_parallel and tp > 1
    ckpt_layer = 2 * s * b * h * (wb / 2) / (tp if sp else 1)  # a checkpointed layer's input
    if ckpt == Checkpointing.SELECTIVE_ATTENTION:  # the score storage is recomputed
        kept = layer_activation_bytes(point, tp, attention=AttentionKernel.FUSED)
    else:
        kept = per_layer_act

    stages = []
    for r in range(pp):
        lr = rank_layers[r]
        n = stage_params(model, tp, pp, r, lr)
        weights, grads, opt, comm = state_bytes(n, lr, one_layer, dp, dp_mode, wb, ob)
        flight = in_flight(par.pp_schedule, pp, m, r, virtual)
        n_ck = checkpointed_layers(layers, pp, r, virtual, ckpt, counts)
        act = flight * (n_ck * ckpt_layer + (lr - n_ck) * kept)
        if n_ck:
            act += per_layer_act  # the layer being recomputed
        if r == 0:
            act += flight * s * b * h * wb / (tp if sp else 1)  # embedding output
        logits = 0.0
        if r == pp - 1:
            logits = s * b * (V / tp) * (wb + 4)  # logits + fp32 log-softmax
        comp = {
            "weights": weights, "gradients": grads, "optimizer": opt, "comm_buffers": comm,
            "activations": act, "logits": logits,
        }
        comp["total_bytes"] = sum(comp.values())
        comp["params_per_device"] = n
        comp["in_flight_micro_batches"] = flight
        stages.append(comp)
    return most_loaded(stages)


def state_bytes(n: int, layers: int, one_layer: int, dp: int, dp_mode: DPMode, wb: int,
                ob: int) -> tuple[float, float, float, float]:
    """Weights, gradients, optimizer state and communication buffers (bytes per device) of a
    stage holding ``n`` parameters, ``layers`` layers of ``one_layer`` parameters each, with
    ``dp`` replicas of them; ``wb``: bytes per weight / gradient, ``ob``: optimizer bytes per
    parameter."""
    shard = n / dp
    # FSDP units: each layer, and the root (what the stage holds besides its layers)
    root = n - layers * one_layer
    unit = max(one_layer, root)
    if dp_mode == DPMode.FSDP:
        weights = wb * min(n, shard + root + 2 * one_layer)
    elif dp_mode == DPMode.FSDP_GRAD_OP:
        weights = wb * (n + shard)
    else:
        weights = wb * n
    replicated_grads = dp_mode in (DPMode.DDP, DPMode.ZERO1)
    if replicated_grads:
        grads = wb * n
    else:  # the shard + an unsharded unit's gradient and its reduce-scatter input
        grads = wb * min(n, shard + 2 * unit) if dp > 1 else wb * n
    opt = ob * (n if dp_mode == DPMode.DDP else shard)
    comm = wb * n if (replicated_grads and dp > 1) else 0.0
    return weights, grads, opt, comm


def most_loaded(stages: list[dict]) -> dict:
    """:func:`estimate`'s answer from every stage's components (bytes per device): the most
    loaded stage's, its index (``stage``) and every stage's total (``per_stage``)."""
    worst = max(range(len(stages)), key=lambda r: stages[r]["total_bytes"])
    out = {k: float(stages[worst][k]) for k in COMPONENTS}
    out["total_bytes"] = float(stages[worst]["total_bytes"])
    out["params_per_device"] = float(stages[worst]["params_per_device"])
    out["in_flight_micro_batches"] = float(stages[worst]["in_flight_micro_batches"])
    out["stage"] = worst
    out["per_stage"] = [float(st["total_bytes"]) for st in stages]
    return out


def model_state_bytes(n_params: float, precision: str = "bf16") -> dict:
    """Weights, gradients and optimizer state of ``n_params`` unsharded parameters (the
    Frontier study's headline: 1T params × 16 B ≈ 14.6 TiB)."""
    half = is_16bit(precision)
    w = (2 if half else 4) * n_params
    o = (12 if half else 8) * n_params
    return {"weights": w, "gradients": w, "optimizer": o, "total_bytes": 2 * w + o}


def fmt_bytes(x: float) -> str:
    """Human-readable binary units (GiB, TiB)."""
    for unit, k in (("TiB", TiB), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= k:
            return f"{x / k:.2f} {unit}"
    return f"{x:.0f} B"


def fits(point: Point, capacity_bytes: float, headroom: float = 0.9,
         known: dict | None = None) -> tuple[bool, str]:
    """Whether the point's most loaded device fits in ``headroom · capacity_bytes``.
    Returns ``(ok, reason)``; the reason names the total, the budget and the components.
    ``known``: the point's :func:`estimate` when the caller has it already."""
    if not (0 < headroom <= 1):
        raise ValueError(f"headroom={headroom} must be in (0, 1]")
    e = known or estimate(point)
    budget = headroom * capacity_bytes
    parts = ", ".join(f"{k} {fmt_bytes(e[k])}" for k in COMPONENTS if e[k] > 0)
    ok = e["total_bytes"] <= budget
    verdict = "fits" if ok else "does not fit"
    reason = (
        f"memory estimate {fmt_bytes(e['total_bytes'])} per device (stage {e['stage']}: {parts}) "
        f"{verdict} in {headroom:.0%} of {fmt_bytes(capacity_bytes)}"
    )
    return ok, reason




__all__ = [
    "estimate", "fits", "model_state_bytes", "stage_params", "layer_activation_bytes", "in_flight",
    "checkpointed_layers", "fmt_bytes", "is_16bit", "COMPONENTS",
]
