"""Pipeline parallelism with ``torch.distributed.pipelining``.

Each stage is the same model class with the pieces it does not own deleted (the torchtitan
convention): the layers are split into pp · virtual_stages stages by the point's
``parallel.pp_partition`` (``scalestudy.config.partition``: equal, balanced by parameters, or
stated), stage ``k`` of a looped schedule lives on pp rank ``k % pp``. The
point's ``grad_accum`` micro-batches of ``micro_batch`` rows are the pipeline's
micro-batches; schedules ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from scalestudy.config.point import Point
from scalestudy.config.vocab import PPSchedule
from scalestudy.config import partition


def split_layers(point: Point) -> list[list[int]]:
    """Global layer indices of each pipeline stage of ``point`` (its partition)."""
    return partition.layer_ids(partition.stage_layers(point))


def prune_stage(model: nn.Module, layer_ids: list[int], first: bool, last: bool) -> nn.Module:
    """Keep only one stage's pieces of ``model`` (in place): its layers, the embeddings on the
    first stage, the final norm and the head on the last."""
    for key in list(model.layers.keys()):
        if int(key) not in layer_ids:
            del model.layers[key]
    if not first:
        model.tok_embeddings = None
        if hasattr(model, "pos_embeddings"):
            model.pos_embeddings = None
    if not last:
        model.norm = None
        model.output = None
    return model


def build_schedule(point: Point, chunks: list[nn.Module], ids: list[int],
                   device: torch.device, group, loss_fn: Callable):
    """``(schedule, stages)`` for this rank's ``chunks`` (stage ``ids``). The loss is divided
    by the micro-batch count by ``loss_fn`` rather than by the schedule's ``scale_grads``,
    which walks ``submod.parameters()`` and so misses the TP shards that TP + DDP (zero1 with
    tp > 1) keeps outside the module's parameter list."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)
    ga = int(point.grad_accum)
    stages = [PipelineStage(m, s, point.stages, device, group=group) for m, s in zip(chunks, ids)]
    sched = point.parallel.pp_schedule
    if sched == PPSchedule.INTERLEAVED_1F1B:
        return ScheduleInterleaved1F1B(stages, n_microbatches=ga, loss_fn=loss_fn,
                                       scale_grads=False), stages
    cls = ScheduleGPipe if sched == PPSchedule.GPIPE else Schedule1F1B
    return cls(stages[0], n_microbatches=ga, loss_fn=loss_fn, scale_grads=False), stages
