"""The device mesh of a point: ``init_device_mesh(device_type, (pp, dp, tp))``, or
``(pp, dp, cp, tp)`` with context parallelism.

tp is the innermost (fastest varying) dimension, so a TP group sits on neighbouring ranks
(inside a node), then cp (Llama 3's order [TP, CP, PP, DP], Dubey et al. 2024 §3.3.2, and
torchtitan's ``[pp, dp, cp, tp]``); pp is the outermost (across nodes). Gradients are averaged
over dp and cp together: :func:`grad_mesh` flattens the two.
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalestudy.config.layout import MESH_DIMS, MESH_DIMS_CP
from scalestudy.config.point import Point


def build_mesh(point: Point, device_type: str) -> DeviceMesh:
    """A (pp, dp, tp) DeviceMesh over the whole world, (pp, dp, cp, tp) when cp > 1 (world
    size must be pp·dp·cp·tp)."""
    world, dp = dist.get_world_size(), int(point.dp)
    size = point.pp * dp * point.cp * point.tp
    if world != size:
        what = "pp*dp*cp*tp" if point.cp > 1 else "pp*dp*tp"
        raise ValueError(f"world size {world} != {what} = {size}; launch that many processes "
                         "or change the layout")
    if point.cp > 1:
        return init_device_mesh(device_type, (point.pp, dp, point.cp, point.tp),
                                mesh_dim_names=MESH_DIMS_CP)
    return init_device_mesh(device_type, (point.pp, dp, point.tp), mesh_dim_names=MESH_DIMS)


def grad_mesh(mesh: DeviceMesh, point: Point) -> DeviceMesh:
    """The ranks that average gradients (and shard them under ``dp_mode``): dp, or dp and cp
    flattened into ``dp_cp`` (torchtitan's ``dp_shard_cp``)."""
    if point.cp == 1:
        return mesh["dp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def is_dtensor(t) -> bool:
    """isinstance(t, DTensor) without importing torch.distributed.tensor (1.4 s per rank):
    while that module is not loaded, nothing can be a DTensor."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)
