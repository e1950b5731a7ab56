"""FLOPs and parameter formulas, under named conventions. Pure functions; units are FLOPs
(multiply + add = 2 FLOPs) and parameter counts.

What is counted: matrix multiplications only (the projections, the MLP, the output head and
the two attention matmuls ``Q K^T`` and ``A V``), forward + backward = 3 × forward. Attention
is counted over the full ``s × s`` score matrix, as Megatron and PaLM do (a causal kernel does
about half of that work). Norms, activations, softmax, bias adds and the loss are not counted;
they are < 1% for real models. This is exactly what ``torch.utils.flop_counter.FlopCounterMode``
counts for ``scalestudy.models`` (``gpt`` and ``llama``) under the math SDPA backend.

Grouped-query attention (``kv_heads`` < ``heads``) shrinks the key and value projections to
``h × kv_dim`` (``kv_dim = kv_heads · head_dim``); the attention matmuls still run for every
query head. Per token and layer, forward + backward, the ``megatron`` convention below is then
``12h² + 12·h·kv_dim + 6·m·h·f + 12·s·h``: exactly Megatron-LM's
``num_floating_point_operations`` of core_v0.6–v0.11 (its ``(1 + g/a)`` query-group term;
core_v0.12+ halves the ``s²`` term for the causal mask) and torchtitan's
``6·(N - N_embedding) + 12·l·H·Q·s`` (which also counts the norms' few weights in ``N``).

Conventions (the name is stored next to every number):

- ``megatron`` — Narayanan et al. SC21, Eq. 3, generalised to any MLP and to grouped-query
  attention. Per sequence and layer the forward pass costs ``2·(2h² + 2·h·kv_dim + m·h·f)·s
  + 4·s²·h`` (``m`` = 2 weight matrices for GELU, 3 for SwiGLU; ``f`` = ffn hidden size;
  ``kv_dim = h`` without GQA) and the output head ``2·s·h·V``, always counted
  (tied or not). For GELU with ``f = 4h`` this is Eq. 3 exactly:
  ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``.
- ``palm`` — Chowdhery et al. 2022, App. B: ``6·N + 12·l·H·Q·s`` per token with ``N`` the
  non-embedding matmul parameters. An untied output head is a matmul weight and counts; a
  tied head *is* the embedding table and does not (PaLM shares its embeddings). With an untied
  head ``palm`` equals ``megatron``.

Hardware FLOPs add what activation checkpointing recomputes:

- ``none`` — nothing: hardware = model FLOPs.
- ``full`` — one more forward pass of every transformer layer (not of the embedding or the
  output head): for GELU 4h this is Eq. 3's recompute form ``96·B·s·l·h²·(1 + s/(6h) +
  V/(16·l·h))``. (PyTorch's non-reentrant checkpoint stops recomputing early and skips each
  layer's last matmul, ``2·h·f·s`` per sequence: the convention is that much above the work
  actually done.)
- ``selective`` — what ``scalestudy.distributed.engine`` runs under that name (torchtitan's layer-
  selective checkpointing): every other layer (global index 0, 2, 4, …, i.e. ``ceil(l/2)``
  layers) re-runs its forward pass.
- ``selective_attention`` — Megatron's selective recompute (Korthikanti et al. 2022,
  "Reducing Activation Recomputation"): only the attention core is recomputed, one more
  ``Q K^T`` and ``A V``: ``4·s²·h`` per sequence and layer. (Not a trainer mode today; here so
  a study that adopts it counts it correctly.)
"""

from __future__ import annotations

from scalestudy.config.parts import Model
from scalestudy.config.vocab import Arch, Checkpointing, FlopsConvention, member


# --- the published formulas, verbatim -------------------------------------------------------


def megatron_params(l: int, h: int, V: int, s: int) -> float:
    """SC21 Eq. 2: parameters of a GPT with ``l`` layers, hidden ``h``, vocabulary ``V`` and
    ``s`` learned positions (GELU 4h MLP, biases, tied embeddings):
    ``12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))``."""
    return 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (V + s) / (12.0 * l * h))


def megatron_flops_per_step(B: int, s: int, l: int, h: int, V: int, recompute: bool = False) -> float:
    """SC21 Eq. 3: FLOPs of one optimizer step over ``B`` sequences of length ``s``.
    ``72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h))``; with full recompute
    ``96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``."""
    if recompute:
        return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))
    return 72.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h))


def palm_flops_per_token(n_nonembed_matmul_params: float, l: int, H: int, Q: int, s: int) -> float:
    """PaLM App. B: training FLOPs per token ``6·N + 12·l·H·Q·s`` (``H`` heads of size ``Q``,
    sequence length ``s``)."""
    return 6.0 * n_nonembed_matmul_params + 12.0 * l * H * Q * s


# --- model-aware ----------------------------------------------------------------------------


def norm_params(model: Model) -> int:
    """Parameters of one norm: LayerNorm (gpt) a weight and, with biases, a bias; RMSNorm
    (llama) a weight."""
    h = model.hidden
    return h + (h if model.bias and model.arch == Arch.GPT else 0)


def position_params(model: Model) -> int:
    """Learned position embeddings (gpt: ``s·h``); rotary positions (llama) have none."""
    return model.seq_len * model.hidden if model.arch == Arch.GPT else 0


def layer_params(model: Model, tp: int = 1) -> dict:
    """Parameters of one transformer layer on one TP rank: ``{"sharded", "replicated"}``.
    Matrices and the column-parallel biases (q, k, v, MLP up/gate) are split over ``tp``;
    the norms and the row-parallel output biases (attention out, MLP down) are not. Keys and
    values are ``h × kv_dim`` (``kv_dim`` = kv_heads · head_dim: smaller than ``h`` under
    grouped-query attention)."""
    h, f, m, kv = model.hidden, model.ffn, model.mlp_matrices, model.kv_dim
    nb = 1 if model.bias else 0
    sharded = 2 * h * h + 2 * h * kv + nb * (h + 2 * kv) + m * h * f + nb * (m - 1) * f
    replicated = 2 * h * nb + 2 * norm_params(model)  # wo/w2 biases, two norms
    return {"sharded": sharded / tp, "replicated": replicated}


def layer_matmul_params(model: Model) -> int:
    """Matmul weights of one transformer layer: q and o (``2h²``), k and v (``2·h·kv_dim``;
    ``2h²`` without grouped-query attention), the MLP (``m·h·f``)."""
    h = model.hidden
    return 2 * h * h + 2 * h * model.kv_dim + model.mlp_matrices * h * model.ffn


def nonembedding_matmul_params(model: Model) -> int:
    """PaLM's ``N``: the layers' matmul weights plus the output head when it is untied."""
    head = 0 if model.tied_embeddings else model.hidden * model.vocab
    return model.layers * layer_matmul_params(model) + head


def param_count(model: Model) -> int:
    """Unique parameters of the built-in model (a tied head counts once): layers, token (and,
    for gpt, position) embeddings, the final norm, the head."""
    h = model.hidden
    lp = layer_params(model)
    emb = model.vocab * h + position_params(model)
    head = 0 if model.tied_embeddings else h * model.vocab
    return int(model.layers * (lp["sharded"] + lp["replicated"]) + emb + norm_params(model)
               + head)


def layer_forward_flops(model: Model, rows: float, seq_len: int | None = None) -> float:
    """Forward FLOPs of one transformer layer on ``rows`` sequences: its matmuls
    (``2·(2h² + 2·h·kv_dim + m·h·f)`` per token, ``2·(4h² + m·h·f)`` without grouped-query
    attention) plus ``Q K^T`` and ``A V`` (``4·s²·h`` per sequence: every query head attends,
    whatever key/value head it shares)."""
    s = seq_len or model.seq_len
    return rows * (2.0 * layer_matmul_params(model) * s + 4.0 * s * s * model.hidden)


def head_forward_flops(model: Model, rows: float) -> float:
    """Forward FLOPs of the output head on ``rows`` sequences: ``2·s·h·V`` per sequence."""
    return rows * 2.0 * model.seq_len * model.hidden * model.vocab


def model_flops_per_step(model: Model, rows: float, convention: str = "megatron") -> float:
    """Model FLOPs (forward + backward, no recompute) of one optimizer step over ``rows``
    sequences of ``model.seq_len`` tokens (all ranks together)."""
    convention = member(FlopsConvention, convention, "flops_convention")
    s = model.seq_len
    if convention == FlopsConvention.PALM:
        n = nonembedding_matmul_params(model)
        return float(rows) * s * palm_flops_per_token(n, model.layers, model.heads,
                                                      model.head_dim, s)
    return 3.0 * (model.layers * layer_forward_flops(model, rows) + head_forward_flops(model, rows))


def recomputed_layers(layers: int, activation_checkpointing: str) -> int:
    """Layers whose whole forward pass the backward re-runs: all (``full``), those with an
    even global index (``selective``: 0, 2, 4, ...), none otherwise."""
    ckpt = member(Checkpointing, activation_checkpointing, "activation_checkpointing")
    if ckpt == Checkpointing.FULL:
        return layers
    if ckpt == Checkpointing.SELECTIVE:
        return (layers + 1) // 2
    return 0


def recompute_flops_per_step(model: Model, rows: float, activation_checkpointing: str) -> float:
    """FLOPs that activation checkpointing adds to one optimizer step (see module doc)."""
    ckpt = member(Checkpointing, activation_checkpointing, "activation_checkpointing")
    if ckpt == Checkpointing.SELECTIVE_ATTENTION:
        return float(rows) * model.layers * 4.0 * model.seq_len ** 2 * model.hidden
    return recomputed_layers(model.layers, ckpt) * layer_forward_flops(model, rows)


def hardware_flops_per_step(model: Model, rows: float, convention: str = "megatron",
                            activation_checkpointing: str = "none") -> float:
    """Hardware FLOPs of one optimizer step: model FLOPs + the recompute (for HFU)."""
    return (model_flops_per_step(model, rows, convention)
            + recompute_flops_per_step(model, rows, activation_checkpointing))


def flops_table(model: Model, rows: float, activation_checkpointing: str = "none") -> dict:
    """``{"model": {conv: flops}, "hardware": {conv: flops}}`` for every convention (what the
    trainer stores in ``summary.json``)."""
    return {
        "model": {c.value: model_flops_per_step(model, rows, c) for c in FlopsConvention},
        "hardware": {c.value: hardware_flops_per_step(model, rows, c, activation_checkpointing)
                     for c in FlopsConvention},
    }


def utilisation(flops_per_step, step_time_s, n, peak_flops_per_device):
    """Fraction of the peak that ``flops_per_step`` over ``step_time_s`` seconds on ``n``
    devices of ``peak_flops_per_device`` FLOP/s reach: MFU with model FLOPs, HFU with hardware
    FLOPs, utilisation vs a measured ceiling with that ceiling (scalars or arrays)."""
    return flops_per_step / (step_time_s * n * peak_flops_per_device)


def per_device_throughput(tokens_per_step, step_time_s, n):
    """X(N) = tokens per step / (T(N) · N): tokens/s per device (scalars or arrays). The
    efficiency of a point is X(N) / X(N0), whatever the mode
    (``scalestudy.analysis.efficiency``)."""
    return tokens_per_step / (step_time_s * n)


def point_flops_table(point) -> dict:
    """:func:`flops_table` of a point, as its workload knows it: the built-in trainer and a
    command with ``flops_per_token: shape`` from the model block; a stated FLOPs-per-token
    gives the model FLOPs of every convention (``value × tokens per step``) and no hardware
    FLOPs (the command's recompute is not known); ``unknown`` gives None everywhere (MFU and
    HFU stay empty, never a guess)."""
    from scalestudy.config.vocab import FlopsSource

    fpt = point.workload.flops_per_token
    conventions = [c.value for c in FlopsConvention]
    if fpt == FlopsSource.SHAPE:
        return flops_table(point.model, point.global_batch,
                           point.parallel.activation_checkpointing)
    if fpt == FlopsSource.UNKNOWN:
        return {"model": dict.fromkeys(conventions), "hardware": dict.fromkeys(conventions)}
    return {"model": dict.fromkeys(conventions, float(fpt) * point.tokens_per_step),
            "hardware": dict.fromkeys(conventions)}
