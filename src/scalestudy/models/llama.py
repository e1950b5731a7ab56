"""A Llama decoder you can read in one sitting.

What differs from ``scalestudy.models.gpt`` (Touvron et al. 2023; Llama 3, Dubey et al. 2024),
as Meta's reference (meta-llama/llama3 ``llama/model.py``) and torchtitan's llama3 model
build it:

- RMSNorm instead of LayerNorm (a weight, no bias), pre-norm blocks and a final norm;
- rotary position embeddings (RoPE) on queries and keys instead of learned positions, in the
  interleaved-pair convention of Meta's checkpoints: feature pairs ``(2i, 2i+1)`` of each
  head are rotated by ``pos · theta^(-2i/head_dim)``. Meta and torchtitan write it as a
  complex product with ``freqs_cis``; here it is the same rotation in real arithmetic (cos
  and sin tables), which every backend and DTensor handles;
- grouped-query attention: ``kv_heads`` key/value heads, each shared by ``heads / kv_heads``
  query heads, so ``wk`` and ``wv`` are ``hidden × kv_heads·head_dim``;
- a SwiGLU MLP ``w2(silu(w1 x) * w3 x)`` of Llama's width (``Model.ffn``), no biases, an
  untied output head (all defaults of ``arch: llama``; ``mlp``, ``bias`` and
  ``tied_embeddings`` can still be set).

The module names are the GPT's and torchtitan's (``tok_embeddings``, ``layers.<i>.attention.
wq/wk/wv/wo``, ``feed_forward.w1/w2/w3``, ``attention_norm``, ``ffn_norm``, ``norm``,
``output``), so tensor and pipeline parallelism, FSDP2, DDP, ZeRO-1 and activation
checkpointing apply unchanged (``scalestudy.distributed``). Under tensor parallelism the
column-parallel ``wq``/``wk``/``wv`` give each rank ``heads/tp`` query and ``kv_heads/tp``
key/value heads (``view(b, s, -1, head_dim)`` infers them), and query head ``j`` still reads
key/value head ``j // (heads/kv_heads)``; the constraints require ``tp`` to divide
``kv_heads``.

The rotary table is a non-persistent buffer of the root module (not in the state dict,
recomputed by ``init_weights``), handed to every block as its second input.
"""

from __future__ import annotations

import torch
from torch import nn

from scalestudy.config.parts import Model
from scalestudy.models.gpt import MLP, attention_core, init_gpt2_

__all__ = ["Llama", "RMSNorm", "rope_table", "apply_rope"]


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) · weight``, computed in fp32 (Meta's ``RMSNorm``)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) \
            * self.weight


def rope_table(head_dim: int, seq_len: int, theta: float, device=None) -> torch.Tensor:
    """``[seq_len, head_dim/2, 2]``: cos and sin of ``pos · theta^(-2i/head_dim)``
    (``precompute_freqs_cis`` of meta-llama/llama3, as real numbers)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2]
                             .float() / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), freqs)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate the feature pairs ``(2i, 2i+1)`` of ``x`` [batch, seq, heads, head_dim] by the
    first ``seq`` positions of ``table`` (``apply_rotary_emb`` of meta-llama/llama3)."""
    s = x.shape[1]
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos = table[:s, :, 0].view(1, s, 1, -1)
    sin = table[:s, :, 1].view(1, s, 1, -1)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: Model):
        super().__init__()
        h, kv = cfg.hidden, cfg.kv_dim
        self.head_dim = cfg.head_dim
        self.n_rep = cfg.heads // cfg.n_kv_heads  # query heads per key/value head
        self.kernel = cfg.attention
        self.recompute_core = False  # selective_attention checkpointing (distributed.checkpointing)
        self.wq = nn.Linear(h, h, bias=cfg.bias)
        self.wk = nn.Linear(h, kv, bias=cfg.bias)
        self.wv = nn.Linear(h, kv, bias=cfg.bias)
        self.wo = nn.Linear(h, h, bias=cfg.bias)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp and kv_heads/tp of them.
        q = apply_rope(self.wq(x).view(b, s, -1, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, s, -1, self.head_dim), rope).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.n_rep > 1:  # query head j reads key/value head j // n_rep
            k = k.repeat_interleave(self.n_rep, dim=1)
            v = v.repeat_interleave(self.n_rep, dim=1)
        y = attention_core(q, k, v, self.kernel, self.recompute_core)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    #: inputs after the hidden states (the rotary table); tensor parallelism leaves them alone
    EXTRA_INPUTS = 1

    def __init__(self, cfg: Model):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.feed_forward = MLP(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token ids [batch, seq] -> logits [batch, seq, vocab] (or hidden states on a pipeline
    stage without the output head). Every top-level piece may be ``None`` on a stage."""

    def __init__(self, cfg: Model):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps)
        self.output = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope", rope_table(cfg.head_dim, cfg.seq_len, cfg.rope_theta),
                             persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """GPT-2's init (N(0, 0.02), residual output projections scaled by 1/sqrt(2 l), norms
        one) and the rotary table (also after ``to_empty`` on a device)."""
        init_gpt2_(self, self.cfg.layers)
        if self.rope.device.type != "meta":
            self.rope.copy_(rope_table(self.cfg.head_dim, self.cfg.seq_len, self.cfg.rope_theta,
                                       device=self.rope.device))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = tokens
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

