"""Gradient clipping over parameters that live on different meshes.

``torch.nn.utils.clip_grad_norm_`` cannot mix DTensors of different meshes (in 3-D, norm
weights and TP weights: "All operands in aten.stack.default must have the same mesh"), so the
norm is reduced per mesh and the squares are combined."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from scalestudy.distributed.mesh import is_dtensor


@torch.no_grad()
def clip_grad_norm_(params, max_norm: float, device: torch.device,
                    pp_group=None) -> torch.Tensor:
    """Clip the global gradient 2-norm of ``params`` (plain, DTensor and TP-local shards
    mixed) to ``max_norm``: norms are reduced per DTensor mesh (``full_tensor``), summed as
    squares, then summed over pipeline stages (``pp_group``). Returns the norm before clipping."""
    groups: dict = {}
    for p in params:
        if p.grad is None:
            continue
        if is_dtensor(p.grad):
            key = p.grad.device_mesh
        elif hasattr(p, "_st_info") and any(pl.is_shard() for pl in p._st_info.placements):
            key = ("local-shard", p._st_info.mesh)  # TP shard localised for DDP
        else:
            key = None
        groups.setdefault(key, []).append(p)
    sq = torch.zeros((), device=device, dtype=torch.float32)
    for key, ps in groups.items():
        n = torch.nn.utils.get_total_norm([p.grad for p in ps], 2.0, foreach=True)
        if is_dtensor(n):
            n = n.full_tensor()
        n2 = n.float() ** 2
        if key is not None and not isinstance(key, DeviceMesh):
            dist.all_reduce(n2, group=key[1].get_group())  # sum of squares over shards
        sq = sq + n2
    if pp_group is not None:
        dist.all_reduce(sq, group=pp_group)
    total = sq.sqrt()
    for ps in groups.values():
        torch.nn.utils.clip_grads_with_norm_(ps, max_norm, total, foreach=True)
    return total
