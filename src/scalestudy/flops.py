"""FLOPs and parameter formulas, under named conventions. Pure functions; units are FLOPs
(multiply + add = 2 FLOPs) and parameter counts.

What is counted: matrix multiplications only (the projections, the MLP, the output head and
the two attention matmuls ``Q K^T`` and ``A V``), forward + backward = 3 × forward. Attention
is counted over the full ``s × s`` score matrix, as Megatron and PaLM do (a causal kernel does
about half of that work). Norms, activations, softmax, bias adds and the loss are not counted;
they are < 1% for real models. This is exactly what ``torch.utils.flop_counter.FlopCounterMode``
counts for ``scalestudy.model.GPT`` under the math SDPA backend.

Conventions (the name is stored next to every number):

- ``megatron`` — Narayanan et al. SC21, Eq. 3, generalised to any MLP. Per sequence and
  layer the forward pass costs ``2·(4h² + m·h·f)·s + 4·s²·h`` (``m`` = 2 weight matrices for
  GELU, 3 for SwiGLU; ``f`` = ffn hidden size) and the output head ``2·s·h·V``, always counted
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
- ``selective`` — what ``scalestudy.parallel`` runs under that name (torchtitan's layer-
  selective checkpointing): every other layer (global index 0, 2, 4, …, i.e. ``ceil(l/2)``
  layers) re-runs its forward pass.
- ``selective_attention`` — Megatron's selective recompute (Korthikanti et al. 2022,
  "Reducing Activation Recomputation"): only the attention core is recomputed, one more
  ``Q K^T`` and ``A V``: ``4·s²·h`` per sequence and layer. (Not a trainer mode today; here so
  a study that adopts it counts it correctly.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from scalestudy.model_config import GPTConfig

CONVENTIONS = ("megatron", "palm")
CHECKPOINTING = ("none", "full", "selective", "selective_attention")


def _check(field: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not supported; allowed: {', '.join(allowed)}")
    return value


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


def _mlp_matrices(cfg: "GPTConfig") -> int:
    _check("model.mlp", cfg.mlp, ("gelu", "swiglu"))
    return 3 if cfg.mlp == "swiglu" else 2


def layer_matmul_params(cfg: "GPTConfig") -> int:
    """Matmul weights of one transformer layer: q, k, v, o (``4h²``) + MLP (``m·h·f``)."""
    h = cfg.hidden
    return 4 * h * h + _mlp_matrices(cfg) * h * cfg.ffn


def nonembedding_matmul_params(cfg: "GPTConfig") -> int:
    """PaLM's ``N``: the layers' matmul weights plus the output head when it is untied."""
    head = 0 if cfg.tied_embeddings else cfg.hidden * cfg.vocab
    return cfg.layers * layer_matmul_params(cfg) + head


def gpt_params(cfg: "GPTConfig") -> int:
    """Unique parameters of ``scalestudy.model.GPT(cfg)`` (a tied head counts once)."""
    h, f, l = cfg.hidden, cfg.ffn, cfg.layers
    nb = 1 if cfg.bias else 0
    m = _mlp_matrices(cfg)
    attn = 4 * h * h + 4 * h * nb
    mlp = m * h * f + nb * ((m - 1) * f + h)
    norms = 2 * (h + nb * h)
    per_layer = attn + mlp + norms
    emb = cfg.vocab * h + cfg.seq_len * h
    head = 0 if cfg.tied_embeddings else h * cfg.vocab
    return l * per_layer + emb + (h + nb * h) + head


def _layer_forward_per_seq(cfg: "GPTConfig", s: int) -> float:
    """Forward FLOPs of one layer on one sequence: matmuls + ``Q K^T`` + ``A V``."""
    return 2.0 * layer_matmul_params(cfg) * s + 4.0 * s * s * cfg.hidden


def model_flops_per_step(cfg: "GPTConfig", rows: int, convention: str) -> float:
    """Model FLOPs (forward + backward, no recompute) of one optimizer step over ``rows``
    sequences of ``cfg.seq_len`` tokens (all ranks together)."""
    _check("flops_convention", convention, CONVENTIONS)
    s, l = cfg.seq_len, cfg.layers
    if convention == "palm":
        n = nonembedding_matmul_params(cfg)
        return float(rows) * s * palm_flops_per_token(n, l, cfg.heads, cfg.head_dim, s)
    fwd = l * _layer_forward_per_seq(cfg, s) + 2.0 * s * cfg.hidden * cfg.vocab
    return 3.0 * rows * fwd


def recompute_flops_per_step(cfg: "GPTConfig", rows: int, activation_checkpointing: str) -> float:
    """FLOPs that activation checkpointing adds to one optimizer step (see module doc)."""
    _check("activation_checkpointing", activation_checkpointing, CHECKPOINTING)
    s, l = cfg.seq_len, cfg.layers
    if activation_checkpointing == "full":
        return float(rows) * l * _layer_forward_per_seq(cfg, s)
    if activation_checkpointing == "selective":  # layers 0, 2, 4, ...
        return float(rows) * ((l + 1) // 2) * _layer_forward_per_seq(cfg, s)
    if activation_checkpointing == "selective_attention":
        return float(rows) * l * 4.0 * s * s * cfg.hidden
    return 0.0


def hardware_flops_per_step(
    cfg: "GPTConfig", rows: int, convention: str, activation_checkpointing: str = "none"
) -> float:
    """Hardware FLOPs of one optimizer step: model FLOPs + the recompute (for HFU)."""
    return model_flops_per_step(cfg, rows, convention) + recompute_flops_per_step(
        cfg, rows, activation_checkpointing
    )


def flops_table(cfg: "GPTConfig", rows: int, activation_checkpointing: str = "none") -> dict:
    """``{"model": {conv: flops}, "hardware": {conv: flops}}`` for every convention (what the
    trainer stores in ``summary.json``)."""
    return {
        "model": {c: model_flops_per_step(cfg, rows, c) for c in CONVENTIONS},
        "hardware": {c: hardware_flops_per_step(cfg, rows, c, activation_checkpointing) for c in CONVENTIONS},
    }


num_params = gpt_params  # the name the trainer uses
