"""The GPT architecture as plain numbers (no torch import: the planner, FLOPs and aggregation
use it without paying for torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GPTConfig:
    """Architecture. Sizes are counts (tokens, features), not bytes."""

    vocab: int = 256
    seq_len: int = 64
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn_hidden: int | None = None  # default: 4h for gelu, Llama's 2/3*4h rounded to 8 for swiglu
    mlp: str = "gelu"  # "gelu" | "swiglu"
    tied_embeddings: bool = False
    bias: bool = True

    @property
    def ffn(self) -> int:
        if self.ffn_hidden:
            return int(self.ffn_hidden)
        if self.mlp == "swiglu":
            return 8 * ((int(8 * self.hidden / 3) + 7) // 8)
        return 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return asdict(self)
