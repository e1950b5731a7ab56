"""A plain PyTorch FSDP2 training script of a small Llama-style model: the kind of script a
study measures through a ``command`` workload. Nothing here comes from scalestudy except the
metrics helper (``scalestudy.train.metrics.StepLogger``), which writes ``steps.jsonl`` into
``$SCALESTUDY_POINT_DIR``. No downloads: the data is a synthetic token stream.

    torchrun --nproc-per-node 2 train.py --layers 2 --hidden 64 --heads 4 --kv-heads 2 \\
        --vocab 256 --seq-len 64 --micro-batch 2 --grad-accum 1 --steps 6

Data parallel only (FSDP2 ``fully_shard`` per block and at the root): global batch =
micro_batch x grad_accum x world size sequences per optimizer step.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from scalestudy.train.metrics import StepLogger


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope(x, theta: float = 10000.0):
    """Rotate feature pairs (2i, 2i+1) of x [batch, seq, heads, head_dim] by pos * theta^(-2i/d)."""
    b, s, h, d = x.shape
    freqs = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device).float() / d)
    ang = torch.outer(torch.arange(s, device=x.device).float(), freqs).view(1, s, 1, -1)
    x0, x1 = x.float().reshape(b, s, h, d // 2, 2).unbind(-1)
    out = torch.stack((x0 * ang.cos() - x1 * ang.sin(), x0 * ang.sin() + x1 * ang.cos()), -1)
    return out.flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, ffn: int):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.attn_norm, self.ffn_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        h = self.attn_norm(x)
        q = rope(self.wq(h).view(b, s, self.heads, self.hd)).transpose(1, 2)
        k = rope(self.wk(h).view(b, s, self.kv_heads, self.hd)).transpose(1, 2)
        v = self.wv(h).view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, s, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(Block(a.hidden, a.heads, a.kv_heads, a.ffn)
                                    for _ in range(a.layers))
        self.norm = RMSNorm(a.hidden)
        self.out = nn.Linear(a.hidden, a.vocab, bias=False)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                std = 0.02 / math.sqrt(2 * a.layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, tokens):
        h = self.tok(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h))


def batch(step: int, rank: int, rows: int, seq_len: int, vocab: int, seed: int):
    """This rank's rows of step ``step``: walks through a fixed permutation of the vocabulary
    with 10% noise, so the loss falls visibly from ln(vocab)."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 10_007 + rank)
    x = torch.empty(rows, seq_len + 1, dtype=torch.long)
    x[:, 0] = torch.randint(vocab, (rows,), generator=g)
    noise = torch.rand(rows, seq_len + 1, generator=g) < 0.1
    rand = torch.randint(vocab, (rows, seq_len + 1), generator=g)
    for t in range(1, seq_len + 1):
        x[:, t] = torch.where(noise[:, t], rand[:, t], perm[x[:, t - 1]])
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("layers", 2), ("hidden", 64), ("heads", 4), ("kv-heads", 2),
                          ("ffn", 176), ("vocab", 256), ("seq-len", 64), ("micro-batch", 2),
                          ("grad-accum", 1), ("steps", 6), ("seed", 0)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--lr", type=float, default=3e-3)
    a = ap.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(a.seed)
    model = Llama(a).to(device)
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95))

    rows = a.micro_batch * a.grad_accum
    log = StepLogger(device=device, tokens_per_step=rows * world * a.seq_len)
    for step in range(a.steps):
        data = batch(step, rank, rows, a.seq_len, a.vocab, a.seed).to(device)
        with log.step() as s:  # one optimizer step, device synchronised around it
            total = torch.zeros((), device=device)
            for i, mb in enumerate(data.chunk(a.grad_accum)):
                if world > 1:
                    model.set_requires_gradient_sync(i == a.grad_accum - 1)
                logits = model(mb[:, :-1])
                loss = F.cross_entropy(logits.flatten(0, 1).float(), mb[:, 1:].flatten())
                (loss / a.grad_accum).backward()
                total += loss.detach() / a.grad_accum
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.loss = total
    log.close()  # every rank: the slowest rank's time per step; rank 0 writes steps.jsonl
    if rank == 0:
        print(f"trained {a.steps} steps on {world} rank(s); loss {float(total):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
