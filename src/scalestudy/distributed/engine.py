"""The engine: one rank's share of a point's training run, built from the parallelisms of this
package. It builds the model (identical weights on every layout), splits it into pipeline
stages, applies TP, activation checkpointing, ``torch.compile`` and the DP wrapper to each,
then steps, gathers the full state, and closes.

Gradient semantics: every layout computes the gradient of the mean token cross-entropy over
the whole global batch (``micro_batch · grad_accum · dp`` rows), so it reproduces one process
with the same seed, data and global batch.
"""

from __future__ import annotations

import contextlib
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from scalestudy.config import layout_rules, trace_scopes
from scalestudy.config.point import Point
from scalestudy.config.vocab import DPMode, DType
from scalestudy.distributed import pipeline
from scalestudy.distributed.checkpointing import apply_checkpointing
from scalestudy.distributed.clipping import clip_grad_norm_
from scalestudy.distributed.data_parallel import apply_data_parallel, make_optimizer, uses_fsdp2
from scalestudy.distributed.mesh import build_mesh, grad_mesh
from scalestudy.distributed.tensor_parallel import tensor_parallelize
from scalestudy.models import build_model
from scalestudy.config import partition
from scalestudy.config.flops import param_count

# Models up to this many parameters are built on CPU with the seed (bitwise identical start
# for every layout); larger ones on the meta device, initialised shard by shard on the device.
CPU_INIT_MAX_PARAMS = 200_000_000


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (nats), computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def position_buffers(model: nn.Module) -> list[torch.Tensor]:
    """The buffers indexed by sequence position (dimension 0) that context parallelism shards
    with the tokens: the learned positions' ids (GPT), the rotary table (Llama)."""
    return [b for name, b in model.named_buffers()
            if name.rsplit(".", 1)[-1] in ("positions", "rope")]


def _clean_name(name: str) -> str:
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(junk, "")
    return name


class Engine:
    """Builds ``point``'s model on this rank and trains it step by step. Needs an initialised
    default process group of pp·dp·cp·tp ranks; builds its own (pp, dp[, cp], tp) mesh.

    Context parallelism (cp > 1): the ``cp`` ranks of a data-parallel rank take the same rows;
    ``torch.distributed.tensor.experimental.context_parallel`` shards the tokens, the targets
    and the position buffers (learned positions' ids, the rotary table) along the sequence
    into ``2·cp`` load-balanced chunks and replaces SDPA by its ring attention for the step;
    gradients are averaged over dp and cp together, and the step's loss over the cp ranks."""

    def __init__(self, point: Point, device: torch.device):
        layout_rules.check(point)  # the planner's shape rules: the same verdict, the same sentence
        mesh = build_mesh(point, device.type)
        self.point, self.mesh, self.device = point, mesh, device
        self.dp_mesh, self.tp_mesh, self.pp_mesh = mesh["dp"], mesh["tp"], mesh["pp"]
        self.cp_mesh = mesh["cp"] if point.cp > 1 else None
        self.grad_mesh = grad_mesh(mesh, point)
        self.dp_rank = self.dp_mesh.get_local_rank()
        self.pp_rank = self.pp_mesh.get_local_rank()
        self.autocast = point.train.precision == DType.BF16 and not uses_fsdp2(point)

        full = self._build_full_model()
        self.stage_ids = partition.rank_stages(point, self.pp_rank) if point.pp > 1 else [0]
        if point.pp > 1:
            split = pipeline.split_layers(point)
            chunks = [pipeline.prune_stage(full if len(self.stage_ids) == 1 else copy.deepcopy(full),
                                           split[s], s == 0, s == point.stages - 1)
                      for s in self.stage_ids]
            del full
        else:
            chunks = [full]
        self.chunks = [self._parallelize(m) for m in chunks]
        # (name, parameter) recorded now: TP+DDP's forward hooks later swap module attributes
        self.named_params = [(_clean_name(n), p) for m in self.chunks
                             for n, p in m.named_parameters()]
        self.params = [p for _, p in self.named_params]
        self.optimizer = make_optimizer(self.params, point, self.grad_mesh, device)
        self.schedule, self.stages = None, []
        if point.pp > 1:
            ga = int(point.grad_accum)
            self.schedule, self.stages = pipeline.build_schedule(
                point, self.chunks, self.stage_ids, device, self.pp_mesh.get_group(),
                lambda logits, targets: loss_fn(logits, targets) / ga)
            self.has_first = 0 in self.stage_ids
            self.has_last = point.stages - 1 in self.stage_ids

    # ---------------------------------------------------------------- construction
    def _build_full_model(self) -> nn.Module:
        big = param_count(self.point.model) > CPU_INIT_MAX_PARAMS
        self._meta_init = big and self.device.type != "cpu"
        if self._meta_init:
            with torch.device("meta"):
                return build_model(self.point.model)
        torch.manual_seed(self.point.train.seed)
        return build_model(self.point.model)

    def _parallelize(self, model: nn.Module) -> nn.Module:
        p = self.point
        if p.tp > 1:
            tensor_parallelize(model, self.tp_mesh, p.parallel.sequence_parallel,
                               p.model.tied_embeddings)
        apply_checkpointing(model, p.parallel.activation_checkpointing)
        if p.train.compile:
            for key in list(model.layers.keys()):
                model.layers[key] = torch.compile(model.layers[key])
        if self._meta_init:  # big model on an accelerator: materialise shards, init there
            model.to_empty(device=self.device)
            if p.model.tied_embeddings and model.output is not None:
                model.output.weight = model.tok_embeddings.weight
            torch.manual_seed(p.train.seed)  # DTensor random init needs one seed on all ranks
            with torch.no_grad():
                model.init_weights()
        else:
            model.to(self.device)
        return apply_data_parallel(model, p, self.grad_mesh, self.device)

    # ---------------------------------------------------------------- training
    def _autocast(self):
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step on this DP rank's rows ``tokens`` [micro_batch·grad_accum,
        seq+1]. Returns the mean token cross-entropy (nats, detached 0-dim) where known (last
        pipeline stage), else None."""
        rows = self.point.rows_per_rank
        if tokens.shape[0] != rows:
            raise ValueError(f"train_step got {tokens.shape[0]} rows, the point needs "
                             f"micro_batch*grad_accum={rows}")
        with record_function(trace_scopes.DATA):
            tokens = tokens.to(self.device, non_blocking=True)
            inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        with self._context_parallel(inputs, targets), record_function(trace_scopes.FORWARD_BACKWARD):
            if self.schedule is not None:
                loss = self._pp_step(inputs, targets)
            else:
                loss = self._plain_step(inputs, targets)
        if self.cp_mesh is not None and loss is not None:  # each cp rank's mean of its tokens
            dist.all_reduce(loss, group=self.cp_mesh.get_group())
            loss = loss / self.point.cp
        if self.point.train.grad_clip is not None:
            with record_function(trace_scopes.CLIP):
                clip_grad_norm_(self.params, self.point.train.grad_clip, self.device,
                                self.pp_mesh.get_group() if self.point.pp > 1 else None)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _context_parallel(self, inputs: torch.Tensor, targets: torch.Tensor):
        """torch's context parallelism over the cp mesh for one step (cp > 1): shards
        ``inputs``, ``targets`` (dimension 1) and this rank's position buffers (dimension 0) in
        place, restoring the buffers afterwards."""
        if self.cp_mesh is None:
            return contextlib.nullcontext()
        from torch.distributed.tensor.experimental import context_parallel

        buffers = [inputs, targets] + [b for m in self.chunks for b in position_buffers(m)]
        return context_parallel(self.cp_mesh, buffers=buffers,
                                buffer_seq_dims=[1, 1] + [0] * (len(buffers) - 2),
                                no_restore_buffers={inputs, targets})

    def _plain_step(self, inputs, targets) -> torch.Tensor:
        """Gradient accumulation over ``grad_accum`` micro-batches; the DP wrappers skip their
        gradient sync until the last one (DDP ``no_sync``, FSDP2
        ``set_requires_gradient_sync``)."""
        model, ga = self.chunks[0], int(self.point.grad_accum)
        total = torch.zeros((), device=self.device)
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        from torch.distributed.fsdp import FSDPModule
        is_replicate = (isinstance(model, FSDPModule)
                        and self.point.parallel.dp_mode in (DPMode.DDP, DPMode.ZERO1))
        for i, (x, y) in enumerate(zip(inputs.chunk(ga), targets.chunk(ga))):
            last = i == ga - 1
            ctx = model.no_sync() if (is_ddp and not last) else contextlib.nullcontext()
            if is_replicate:
                model.set_requires_gradient_sync(last)
            with ctx:
                with self._autocast():
                    logits = model(x)
                loss = loss_fn(logits, y)
                (loss / ga).backward()
            total += loss.detach()
        return total / ga

    def _pp_step(self, inputs, targets) -> torch.Tensor | None:
        losses: list[torch.Tensor] = []
        with self._autocast():
            if self.has_first:
                self.schedule.step(inputs, target=targets, losses=losses)
            elif self.has_last:
                self.schedule.step(target=targets, losses=losses)
            else:
                self.schedule.step()
        if self.has_last:
            return torch.stack([loss.detach().float() for loss in losses]).sum()  # each is /ga
        return None

    def close(self) -> None:
        """Drop model, optimizer and schedule references."""
        self.schedule = None
        self.stages = []
        self.optimizer = None
        self.params = []
        self.named_params = []
        self.chunks = []
