"""The device mesh of a point: ``init_device_mesh(device_type, (pp, dp, tp))``.

tp is the innermost (fastest varying) dimension, so a TP group sits on neighbouring ranks
(inside a node); pp is the outermost (across nodes).
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalestudy.config.point import Point

MESH_DIMS = ("pp", "dp", "tp")


def build_mesh(point: Point, device_type: str) -> DeviceMesh:
    """A (pp, dp, tp) DeviceMesh over the whole world (world size must be pp·dp·tp)."""
    world, dp = dist.get_world_size(), int(point.dp)
    if world != point.pp * dp * point.tp:
        raise ValueError(f"world size {world} != pp*dp*tp = {point.pp * dp * point.tp}; launch "
                         "that many processes or change the layout")
    return init_device_mesh(device_type, (point.pp, dp, point.tp), mesh_dim_names=MESH_DIMS)


def is_dtensor(t) -> bool:
    """isinstance(t, DTensor) without importing torch.distributed.tensor (1.4 s per rank):
    while that module is not loaded, nothing can be a DTensor."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)
