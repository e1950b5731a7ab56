"""The order of a point's device mesh and where a rank sits in it.

The trainer's mesh is ``(pp, dp, tp)``, or ``(pp, dp, cp, tp)`` with context parallelism
(``scalestudy.distributed.mesh``): tp the innermost (fastest varying) dimension, pp the
outermost. A rank's coordinates follow from its global rank alone, so a reader of a run's
records (its traces, say) finds which ranks share a tensor-parallel, data-parallel or
pipeline group without torch.
"""

from __future__ import annotations

MESH_DIMS = ("pp", "dp", "tp")
MESH_DIMS_CP = ("pp", "dp", "cp", "tp")


def mesh_dims(cp: int) -> tuple[str, ...]:
    """The mesh's dimension names, outermost first (``cp`` ranks of context parallelism)."""
    return MESH_DIMS_CP if cp > 1 else MESH_DIMS


def rank_coords(rank: int, sizes: dict[str, int]) -> dict[str, int]:
    """The coordinates of global ``rank`` on a mesh of ``sizes`` (``{"pp", "dp", "tp"}`` and
    optionally ``"cp"``, counts of ranks), e.g. rank 5 of pp 2 x dp 2 x tp 2 is
    ``{"pp": 1, "dp": 0, "tp": 1}``. ``ValueError`` for a rank outside the mesh."""
    dims = mesh_dims(int(sizes.get("cp", 1)))
    world = 1
    for d in dims:
        world *= int(sizes.get(d, 1))
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a mesh of {world} ranks")
    out, rest = {}, rank
    for d in reversed(dims):
        size = int(sizes.get(d, 1))
        out[d] = rest % size
        rest //= size
    return {d: out[d] for d in dims}


def group_key(rank: int, sizes: dict[str, int], dims: tuple[str, ...]) -> tuple:
    """What the ranks of one group along ``dims`` share: ``rank``'s coordinates on every other
    dimension (two ranks are in the same ``dims`` group when their keys are equal)."""
    coords = rank_coords(rank, sizes)
    return tuple((d, c) for d, c in coords.items() if d not in dims)


def profiled_ranks(sizes: dict[str, int], policy: str) -> list[int]:
    """The ranks that write a trace under ``profile.ranks`` ``policy``: ``all``, or
    ``groups``: the ranks of tensor- and context-parallel coordinate 0 that are data-parallel
    rank 0 (one per pipeline stage) or pipeline stage 0 (one per data-parallel rank)."""
    world = 1
    for d in mesh_dims(int(sizes.get("cp", 1))):
        world *= int(sizes.get(d, 1))
    if policy == "all":
        return list(range(world))
    out = []
    for r in range(world):
        c = rank_coords(r, sizes)
        if c["tp"] == 0 and c.get("cp", 0) == 0 and (c["dp"] == 0 or c["pp"] == 0):
            out.append(r)
    return out
