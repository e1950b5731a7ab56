"""Activation checkpointing, as the FLOPs and memory models count it:

- ``full``: every block is wrapped in a non-reentrant ``checkpoint_wrapper``;
- ``selective``: every other block (global layer index 0, 2, 4, ...), torchtitan's
  layer-selective checkpointing;
- ``selective_attention``: only the attention core (``Q K^T``, softmax, ``A V``) is
  recomputed, Megatron's selective recomputation (Korthikanti et al. 2022).
"""

from __future__ import annotations

from torch import nn

from scalestudy.config.vocab import Checkpointing


def apply_checkpointing(model: nn.Module, mode: Checkpointing) -> None:
    """Wrap ``model``'s blocks (``model.layers``, keyed by global index) in place."""
    if mode == Checkpointing.NONE:
        return
    if mode == Checkpointing.SELECTIVE_ATTENTION:
        for block in model.layers.values():
            block.attention.recompute_core = True
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)
    for key in list(model.layers.keys()):
        if mode == Checkpointing.FULL or int(key) % 2 == 0:
            model.layers[key] = checkpoint_wrapper(model.layers[key],
                                                   checkpoint_impl=CheckpointImpl.NO_REENTRANT)
