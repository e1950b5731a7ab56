"""Data parallelism over the mesh's ``dp`` dimension, PyTorch's own wrappers:

- ``ddp``: ``DistributedDataParallel`` when tp == pp == 1; FSDP2's ``replicate`` (DTensor
  based DDP) when combined with TP or PP;
- ``zero1``: the same gradient all-reduce (DDP) plus ``ZeroRedundancyOptimizer`` (optimizer
  state sharded over dp; built by the engine); with TP it uses PyTorch's TP + DDP recipe;
- ``fsdp_grad_op``: ``fully_shard(reshard_after_forward=False)`` per block + root (ZeRO-2-like);
- ``fsdp``: ``fully_shard`` per block + root (ZeRO-3).

Precision ``bf16``: fp32 master weights and optimizer state, bf16 compute. The FSDP2 family
casts with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``; classic DDP /
ZeRO-1 (and no DP wrapper) run under ``torch.autocast``.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from scalestudy.config.point import DPWrapper, Point
from scalestudy.config.vocab import DPMode, DType


def uses_fsdp2(point: Point) -> bool:
    """Whether the DP wrapper is of the FSDP2 family (``fully_shard`` or ``replicate``)."""
    return point.dp_wrapper in (DPWrapper.FULLY_SHARD, DPWrapper.REPLICATE)


def apply_data_parallel(model: nn.Module, point: Point, dp_mesh: DeviceMesh,
                        device: torch.device) -> nn.Module:
    """``model`` wrapped for data parallelism over ``dp_mesh`` (``point.dp_wrapper``;
    unchanged when dp == 1)."""
    wrapper = point.dp_wrapper
    if wrapper == DPWrapper.NONE:
        return model
    if uses_fsdp2(point):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if point.train.precision == DType.BF16 else MixedPrecisionPolicy())
        if wrapper == DPWrapper.FULLY_SHARD:
            reshard = point.parallel.dp_mode == DPMode.FSDP
            for block in model.layers.values():
                fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
            fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
            return model
        # ddp with tp > 1 or pp > 1: DTensor-based DDP (FSDP2 machinery, replicate only).
        from torch.distributed._composable.replicate_with_fsdp import replicate
        return replicate(model, mesh=dp_mesh, mp_policy=mp)
    if point.tp > 1:  # zero1 with TP: DDP over the TP-local shards (PyTorch's TP+DDP recipe)
        from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
        _pre_dp_module_transform(model)
    return distributed_data_parallel(model, dp_mesh.get_group(), device,
                                     find_unused=point.pp > 1,
                                     bucket_cap_mb=point.parallel.ddp_bucket_cap_mb)


def distributed_data_parallel(model: nn.Module, group, device: torch.device,
                              find_unused: bool = False,
                              bucket_cap_mb: float | None = None) -> nn.Module:
    """``model`` under ``DistributedDataParallel`` over the process ``group`` as the trainer
    runs it (the calibration times its cost on a one-rank group the same way);
    ``bucket_cap_mb``: its gradient bucket size (MiB; None: torch's default).

    ``find_unused`` under PP: PipelineStage drives DDP's reducer per micro-batch and DDP's
    bucket rebuild after the first step then asserts (torch 2.13); finding unused parameters
    disables the rebuild. No buffer sync before each forward: the models' buffers (position
    ids, the rotary table) are constants built alike on every rank; DDP's default broadcast
    of them before every forward is a collective per micro-batch that waits for the slowest
    rank (profiled on gloo: ~0.2 ms a call, and the wait inside DDP's forward). torch >= 2.13
    names it ``forward_sync_buffers`` (``broadcast_buffers`` is deprecated there; 2.11, the
    GPU machine's, has only ``broadcast_buffers``): chosen by signature, not by version."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    sync = ("forward_sync_buffers" if "forward_sync_buffers" in
            inspect.signature(DDP.__init__).parameters else "broadcast_buffers")
    bucket = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}  # (MiB)
    return DDP(model, process_group=group,
               device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused, **{sync: False}, **bucket)


def make_optimizer(params: list, point: Point, dp_mesh: DeviceMesh, device: torch.device):
    """AdamW (the point's ``train`` lr, betas and weight decay; fp32 state; fused on CUDA,
    foreach elsewhere) over ``params``, sharded over the
    dp group for ``zero1`` (``ZeroRedundancyOptimizer``). DTensor and plain parameters go into
    separate groups: foreach/fused kernels cannot mix them."""
    from scalestudy.distributed.mesh import is_dtensor

    groups = [[p for p in params if is_dtensor(p)], [p for p in params if not is_dtensor(p)]]
    param_groups = [{"params": g} for g in groups if g]
    kw = dict(lr=point.train.lr, betas=point.train.betas, weight_decay=point.train.weight_decay)
    kw["fused" if device.type == "cuda" else "foreach"] = True
    if point.parallel.dp_mode == DPMode.ZERO1 and point.dp_cp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(param_groups, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_mesh.get_group(), **kw)
    return torch.optim.AdamW(param_groups, **kw)
