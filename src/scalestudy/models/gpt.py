"""A GPT decoder you can read in one sitting.

Pre-norm blocks, causal SDPA attention with separate q/k/v projections (so tensor parallelism
splits heads cleanly), GELU (4h, Megatron/GPT-2) or SwiGLU MLP, learned position embeddings,
tied or untied output head. Layers live in a ``ModuleDict`` keyed by their global index and
every top-level piece may be ``None``, so a pipeline stage is the same class with the pieces it
does not own deleted (the torchtitan convention).

With ``bias=True``, GELU, ffn = 4h and tied embeddings the parameter count is Megatron's
Eq. 2, ``12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h))``, plus the final norm (2h).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from scalestudy.config.parts import Model
from scalestudy.config.vocab import AttentionKernel

__all__ = ["GPT"]


def _sdpa(q, k, v, kernel: AttentionKernel) -> torch.Tensor:
    if kernel == AttentionKernel.MATH:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_core(q, k, v, kernel: AttentionKernel, recompute: bool = False) -> torch.Tensor:
    """Causal scaled dot-product attention over [batch, heads, seq, head_dim]; ``math``
    materialises the s x s scores. ``recompute``: the backward pass re-runs it instead of
    keeping its intermediates (``selective_attention`` checkpointing)."""
    if recompute and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(_sdpa, q, k, v, kernel, use_reentrant=False)
    return _sdpa(q, k, v, kernel)


@torch.no_grad()
def init_gpt2_(model: nn.Module, layers: int) -> None:
    """GPT-2's init, in place: weights N(0, 0.02), the residual output projections (``wo``,
    ``w2``) N(0, 0.02/sqrt(2·layers)), norm weights one, biases zero."""
    std_out = 0.02 / math.sqrt(2 * layers)
    for name, p in model.named_parameters():
        if p.dim() == 1:
            nn.init.ones_(p) if name.endswith("norm.weight") else nn.init.zeros_(p)
        elif name.endswith(("wo.weight", "w2.weight")):
            nn.init.normal_(p, 0.0, std_out)
        else:
            nn.init.normal_(p, 0.0, 0.02)


class Attention(nn.Module):
    def __init__(self, cfg: Model):
        super().__init__()
        h = cfg.hidden
        self.head_dim = cfg.head_dim
        self.kernel = cfg.attention
        self.recompute_core = False  # selective_attention checkpointing (distributed.checkpointing)
        self.wq = nn.Linear(h, h, bias=cfg.bias)
        self.wk = nn.Linear(h, h, bias=cfg.bias)
        self.wv = nn.Linear(h, h, bias=cfg.bias)
        self.wo = nn.Linear(h, h, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        y = attention_core(q, k, v, self.kernel, self.recompute_core)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(torch.autograd.Function):
    """``silu(a) * b`` keeping only ``a`` and ``b`` for the backward pass (``silu`` is recomputed
    there), as Megatron-LM's fused ``bias_swiglu``: with the down projection's input that is
    three ``f``-wide activations per layer instead of autograd's four."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return F.silu(a) * b

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        sig = torch.sigmoid(a)
        return grad * b * sig * (1 + a * (1 - sig)), grad * a * sig


class MLP(nn.Module):
    def __init__(self, cfg: Model):
        super().__init__()
        h, f = cfg.hidden, cfg.ffn
        self.swiglu = cfg.mlp == "swiglu"
        self.w1 = nn.Linear(h, f, bias=cfg.bias)  # up (gelu) / gate (swiglu)
        self.w3 = nn.Linear(h, f, bias=cfg.bias) if self.swiglu else None  # up (swiglu)
        self.w2 = nn.Linear(f, h, bias=cfg.bias)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.w2(SwiGLU.apply(self.w1(x), self.w3(x)))
        return self.w2(F.gelu(self.w1(x), approximate="tanh"))


class Block(nn.Module):
    EXTRA_INPUTS = 0  # inputs after the hidden states (none; llama's blocks take its rotary table)

    def __init__(self, cfg: Model):
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)
        self.feed_forward = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GPT(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab] (or hidden states on a stage
    without the output head)."""

    def __init__(self, cfg: Model):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos_embeddings = nn.Embedding(cfg.seq_len, cfg.hidden)
        # position ids as a buffer: context parallelism shards it with the tokens
        self.register_buffer("positions", torch.arange(cfg.seq_len), persistent=False)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's init and the position ids (also after ``to_empty`` on a device)."""
        init_gpt2_(self, self.cfg.layers)
        if self.positions.device.type != "meta":
            self.positions.copy_(torch.arange(self.cfg.seq_len, device=self.positions.device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens) + self.pos_embeddings(
                self.positions[:tokens.shape[1]])
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h
