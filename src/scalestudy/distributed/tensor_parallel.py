"""Megatron-style tensor parallelism with ``parallelize_module`` (the plan of torchtitan's
llama3 ``apply_tp``, which serves both ``scalestudy.models`` decoders): column-parallel q/k/v and
MLP input (``w1``/``w3``), row-parallel output projections (``wo``/``w2``), so heads split
across ranks; a vocabulary-sharded embedding (row-wise) and output head (column-wise, logits
gathered). Sequence parallelism shards the norms' and the residual stream's sequence
dimension (``SequenceParallel``: reduce-scatter / all-gather instead of all-reduce)."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh


def tensor_parallelize(model: nn.Module, tp_mesh: DeviceMesh, sp: bool, tied: bool) -> None:
    """TP of ``model`` (a ``scalestudy.models`` decoder or one pipeline stage of it) in place
    over ``tp_mesh``; ``sp``: sequence parallelism; ``tied``: re-tie the sharded head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel,
        parallelize_module)
    act = Shard(1) if sp else Replicate()
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(),
                                                output_layouts=Replicate())
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Replicate())
        if sp:
            top["norm"] = SequenceParallel()
    if top:
        parallelize_module(model, tp_mesh, top)
    if tied and model.output is not None:
        model.output.weight = model.tok_embeddings.weight  # both Shard(0) over vocab
    for key, block in model.layers.items():
        # llama's blocks and attention take the rotary table after the hidden states: it
        # stays a plain (replicated) tensor
        rest = (None,) * getattr(block, "EXTRA_INPUTS", 0)
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=act),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        # one replicated input per sub-block, so its column-parallel projections' input
        # gradients add up before one exchange (Megatron's "f"): wq/wk/wv (w1/w3) converting
        # the plain input each would exchange each gradient on its own
        plan["attention"] = PrepareModuleInput(input_layouts=(act, *rest),
                                               desired_input_layouts=(Replicate(), *rest))
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(act,),
                                                  desired_input_layouts=(Replicate(),))
        if sp:
            plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel()})
            if key == "0":  # the replicated embedding sum enters the sharded stream
                plan[""] = PrepareModuleInput(input_layouts=(Replicate(), *rest),
                                              desired_input_layouts=(Shard(1), *rest),
                                              use_local_output=True)
        parallelize_module(block, tp_mesh, plan)
