"""How a point's layers split into pipeline stages (``parallel.pp_partition``). Pure functions.

There are ``S = pp · virtual_stages`` stages in stage order; stage ``k`` runs on pipeline rank
``k % pp`` (the looped schedules), the first holds the embeddings, the last the final norm
and the output head. The methods:

- ``uniform``: ``layers / S`` layers each; the layers must divide (Megatron-LM's rule).
- ``parameters``: the contiguous split whose heaviest stage holds the fewest parameters,
  counting the embeddings with the first layer and the norm and head with the last (the
  balance DeepSpeed's ``PipelineModule(partition_method="parameters")`` seeks with
  ``ds_utils.partition_balanced`` over per-layer parameter counts; Megatron-DeepSpeed's
  ``type:transformer|embedding`` weighs a layer and an embedding alike, which for BLOOM-176B
  gives the same split). BLOOM-176B, 70 layers on 12 stages: 5, 6 x 10, 5;
  Llama 3 405B, 126 layers on 16 stages: 7, 8 x 14, 7 (the split Dubey et al. 2024 §3.3.2
  describe: "one Transformer layer fewer on the first and the last stage").
- an explicit tuple: the layers of every stage, in stage order.
"""

from __future__ import annotations

from functools import lru_cache

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.vocab import PPPartition
from scalestudy.config.flops import layer_params, norm_params, position_params


def problem(point: Point) -> str | None:
    """Why ``point``'s layers cannot split into its stages (a sentence), or None."""
    layers, stages = point.model.layers, point.stages
    part = point.parallel.pp_partition
    if isinstance(part, tuple):
        if len(part) != stages:
            return (f"pp_partition has {len(part)} stages, the layout has pp*virtual_stages="
                    f"{stages}")
        if sum(part) != layers:
            return f"pp_partition holds {sum(part)} layers, the model has layers={layers}"
        return None
    if layers < stages:
        return f"layers={layers} are fewer than pp*virtual_stages={stages} stages"
    if part == PPPartition.UNIFORM and layers % stages:
        return (f"layers={layers} do not split into pp*virtual_stages={stages} equal stages "
                "(pp_partition: parameters, or a list of layers per stage)")
    return None


def _weights(model: Model) -> tuple[int, int, int]:
    """(one layer's, the first stage's extra, the last stage's extra) parameters."""
    lp = layer_params(model)
    head = norm_params(model) + model.vocab * model.hidden  # own copy when tied, as Megatron
    return (int(lp["sharded"] + lp["replicated"]), model.vocab * model.hidden
            + position_params(model), head)


def balanced(weights: list[int], parts: int) -> list[int]:
    """Items per part of the contiguous split of ``weights`` into ``parts`` non-empty parts
    whose heaviest part is lightest (binary search on the bottleneck, then a greedy fill that
    leaves every later part at least one item)."""
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} items into {parts} non-empty parts")

    def fill(bound: int) -> list[int] | None:
        counts, load = [], 0
        for i, w in enumerate(weights):
            # join the current part if it stays within the bound and enough items remain
            # for the parts still to come
            if counts and load + w <= bound and n - i > parts - len(counts):
                counts[-1] += 1
                load += w
            elif w > bound:
                return None
            else:
                counts.append(1)
                load = w
        return counts if len(counts) <= parts else None

    lo, hi = max(weights), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if fill(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    return fill(lo)  # exactly ``parts`` parts: the fill cuts once items run short


def stage_layers(point: Point) -> tuple[int, ...]:
    """Layers of every pipeline stage, in stage order (the point's partition must be valid:
    :func:`problem`)."""
    reason = problem(point)
    if reason:
        raise ValueError(reason)
    layers, stages = point.model.layers, point.stages
    part = point.parallel.pp_partition
    if isinstance(part, tuple):
        return part
    if part == PPPartition.UNIFORM or stages == 1:
        return (layers // stages,) * stages
    return _parameter_split(*_weights(point.model), layers, stages)


@lru_cache(maxsize=4096)
def _parameter_split(one: int, first: int, last: int, layers: int, stages: int) -> tuple[int, ...]:
    """The ``parameters`` split of ``layers`` layers of ``one`` parameters each, the first
    with ``first`` and the last with ``last`` more, into ``stages`` (a search the model asks
    for many times per point: remembered)."""
    weights = [one] * layers
    weights[0] += first
    weights[-1] += last
    return tuple(balanced(weights, stages))


def layer_ids(counts: tuple[int, ...] | list[int]) -> list[list[int]]:
    """Global layer indices of each stage of ``counts``."""
    out, start = [], 0
    for k in counts:
        out.append(list(range(start, start + k)))
        start += k
    return out


def rank_stages(point: Point, pp_rank: int) -> list[int]:
    """The stages pipeline rank ``pp_rank`` runs: ``pp_rank + k·pp`` for each virtual stage."""
    return [pp_rank + k * point.pp for k in range(point.parallel.virtual_stages)]


def rank_layers(point: Point) -> list[int]:
    """Layers held by each pipeline rank (the sum over its virtual stages)."""
    counts = stage_layers(point)
    return [sum(counts[s] for s in rank_stages(point, r)) for r in range(point.pp)]


__all__ = ["problem", "balanced", "stage_layers", "layer_ids", "rank_stages", "rank_layers"]
