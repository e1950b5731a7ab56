"""A deterministic synthetic token stream with learnable structure.

Each row is a walk through a fixed random permutation ``pi`` of the vocabulary: the next token
is ``pi(current)`` with probability ``1 - noise``, otherwise a uniformly random token. A model
that learns ``pi`` reaches a loss near the noise floor, so the loss falls visibly from
``ln(vocab)`` within a few dozen steps.

Row ``r`` of step ``t`` depends only on ``(seed, t, r)``: any rank can build exactly its own
rows of the global batch, and every parallel layout sees the same global batch.
"""

from __future__ import annotations

import math

import torch


class SyntheticTokens:
    def __init__(self, vocab: int, seq_len: int, seed: int = 0, noise: float = 0.1):
        self.vocab, self.seq_len, self.seed, self.noise = vocab, seq_len, seed, noise
        g = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(vocab, generator=g)

    def rows(self, step: int, start: int, count: int) -> torch.Tensor:
        """Rows ``[start, start + count)`` of step ``step``: int64 tensor [count, seq_len + 1]
        (inputs are ``[:, :-1]``, targets ``[:, 1:]``)."""
        n = self.seq_len + 1
        rand, reset = [], []
        for r in range(start, start + count):
            g = torch.Generator().manual_seed(hash((self.seed, step, r)) & 0x7FFF_FFFF_FFFF)
            rand.append(torch.randint(self.vocab, (n,), generator=g))
            reset.append(torch.rand(n, generator=g) < self.noise)
        rand_t, reset_t = torch.stack(rand), torch.stack(reset)
        out = torch.empty_like(rand_t)
        out[:, 0] = rand_t[:, 0]
        for t in range(1, n):
            out[:, t] = torch.where(reset_t[:, t], rand_t[:, t], self.perm[out[:, t - 1]])
        return out

    def noise_floor(self) -> float:
        """Cross-entropy (nats) of the ideal predictor: the irreducible loss."""
        p_hit = 1 - self.noise + self.noise / self.vocab
        p_miss = self.noise / self.vocab
        return -(p_hit * math.log(p_hit) + (self.vocab - 1) * p_miss * math.log(p_miss))
