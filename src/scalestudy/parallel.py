"""Parallel training engine: DeviceMesh, DP (DDP / ZeRO-1 / FSDP2), TP (+SP), PP, checkpointing.

Everything is PyTorch's own API:

- mesh: ``init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))``;
  tp is the innermost (fastest varying) dimension, so a TP group sits on neighbouring ranks
  (inside a node), PP outermost (across nodes).
- TP: ``parallelize_module`` with Megatron's split: ``wq/wk/wv`` and ``w1/w3`` column-wise,
  ``wo/w2`` row-wise (heads split across ranks); vocab-parallel token embedding (row-wise) and
  output head (column-wise, logits gathered). ``sequence_parallel`` shards the norms' and the
  residual stream's sequence dimension (``SequenceParallel``, reduce-scatter / all-gather).
- PP: ``torch.distributed.pipelining`` -- each stage is the same ``GPT`` class with the pieces
  it does not own deleted; layers are split as evenly as possible over ``pp * virtual_stages``
  stages (stage ``k`` of a looped schedule lives on pp rank ``k % pp``); schedules
  ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``.
- DP: ``ddp`` = ``DistributedDataParallel`` when tp == 1, FSDP2's ``replicate`` (DTensor based
  DDP) when tp > 1; ``zero1`` = the same gradient all-reduce plus
  ``ZeroRedundancyOptimizer`` (optimizer state sharded over dp); ``fsdp`` = ``fully_shard``
  (ZeRO-3), ``fsdp_grad_op`` = ``fully_shard(reshard_after_forward=False)`` (ZeRO-2-like).
- activation checkpointing: ``full`` wraps every block in ``checkpoint_wrapper``
  (non-reentrant); ``selective`` wraps every other block (global layer index even: 0, 2, ...).
- precision ``bf16``: fp32 master weights and optimizer state, bf16 compute (FSDP2
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` for fsdp modes and ``replicate``;
  ``torch.autocast`` for DDP / ZeRO-1 and no DP wrapper). The loss is computed in fp32.

Gradient semantics: every layout computes the gradient of the mean token cross-entropy over
the whole global batch (``micro_batch * grad_accum * dp`` rows), so it reproduces one process
with the same seed, data and global batch.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from scalestudy.model import GPT, GPTConfig

DP_MODES = ("ddp", "zero1", "fsdp", "fsdp_grad_op")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")
AC_MODES = ("none", "full", "selective")
PRECISIONS = ("fp32", "bf16")

# Models up to this many parameters are built on CPU with the seed (bitwise identical start
# for every layout); larger ones on the meta device, initialised shard by shard on the device.
CPU_INIT_MAX_PARAMS = 200_000_000

def _is_dtensor(t) -> bool:
    """isinstance(t, DTensor) without importing torch.distributed.tensor (1.4 s per rank):
    while that module is not loaded, nothing can be a DTensor."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)



@dataclass(frozen=True)
class Layout:
    """How one point is parallelised. Batch sizes count sequences (rows)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1  # rows per micro-batch per DP rank
    grad_accum: int = 1  # micro-batches per optimizer step per DP rank (= PP micro-batches)
    dp_mode: str = "ddp"  # "ddp" | "zero1" | "fsdp" | "fsdp_grad_op"
    pp_schedule: str = "1f1b"  # "gpipe" | "1f1b" | "interleaved1f1b"
    virtual_stages: int = 1  # pipeline stages per pp rank (interleaved schedule)
    sequence_parallel: bool = False
    activation_checkpointing: str = "none"  # "none" | "full" | "selective"
    precision: str = "fp32"  # "fp32" | "bf16"
    compile: bool = False  # torch.compile per block

    def __post_init__(self):
        for name in ("dp", "tp", "pp", "micro_batch", "grad_accum", "virtual_stages"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Layout.{name}={getattr(self, name)} must be >= 1")
        for name, allowed in (("dp_mode", DP_MODES), ("pp_schedule", PP_SCHEDULES),
                              ("activation_checkpointing", AC_MODES), ("precision", PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Layout.{name}={getattr(self, name)!r}: use one of {allowed}")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def stages(self) -> int:
        """Pipeline stages in total (pp * virtual stages)."""
        return self.pp * self.virtual_stages

    @classmethod
    def from_point(cls, point: dict) -> "Layout":
        """From a resolved ``point.json`` (docs/architecture.md)."""
        par = point.get("parallel", {}) or {}
        train = point.get("train", {}) or {}
        kw = {k: point[k] for k in ("dp", "tp", "pp", "micro_batch", "grad_accum") if k in point}
        names = {f.name for f in fields(cls)}
        kw.update({k: v for k, v in par.items() if k in names})
        if "precision" in train:
            kw["precision"] = train["precision"]
        if "compile" in train and "compile" not in par:
            kw["compile"] = bool(train["compile"])
        return cls(**kw)


def check_layout(cfg: GPTConfig, layout: Layout) -> None:
    """Raise ValueError (one line naming the field and the fix) if the engine cannot run it."""
    L = layout
    if L.tp > 1:
        if cfg.heads % L.tp:
            raise ValueError(f"tp={L.tp} must divide model.heads={cfg.heads}")
        for name, v in (("hidden", cfg.hidden), ("ffn", cfg.ffn), ("vocab", cfg.vocab)):
            if v % L.tp:
                raise ValueError(f"tp={L.tp} must divide model.{name}={v}")
        if L.sequence_parallel and cfg.seq_len % L.tp:
            raise ValueError(f"sequence_parallel: tp={L.tp} must divide seq_len={cfg.seq_len}")
    if L.dp_mode == "zero1" and L.dp > 1 and L.tp > 1 and cfg.tied_embeddings:
        raise ValueError("dp_mode=zero1 with tp > 1 needs model.tied_embeddings=false (TP+DDP "
                         "cannot localise a tied weight); use fsdp_grad_op or untie")
    if L.pp == 1 and L.virtual_stages != 1:
        raise ValueError(f"virtual_stages={L.virtual_stages} needs pp > 1; set it to 1")
    if L.pp > 1:
        if cfg.tied_embeddings:
            raise ValueError("pp > 1 needs model.tied_embeddings=false (embedding and head "
                             "live on different stages)")
        if L.pp_schedule != "interleaved1f1b" and L.virtual_stages != 1:
            raise ValueError(f"pp_schedule={L.pp_schedule} runs one stage per rank: set "
                             f"virtual_stages=1 or use interleaved1f1b")
        if cfg.layers < L.stages:
            raise ValueError(f"layers={cfg.layers} < pp*virtual_stages={L.stages}: every "
                             f"stage needs at least one layer")
        if L.pp_schedule in ("1f1b", "interleaved1f1b") and L.grad_accum < L.pp:
            raise ValueError(f"{L.pp_schedule} needs grad_accum (micro-batches) >= pp={L.pp}, "
                             f"got {L.grad_accum}")
        if L.pp_schedule == "interleaved1f1b":
            rounds = max(1, L.grad_accum // L.pp)
            if L.grad_accum % rounds:
                raise ValueError(f"interleaved1f1b needs grad_accum={L.grad_accum} to be a "
                                 f"multiple of grad_accum // pp = {rounds}")


def build_mesh(layout: Layout, device_type: str) -> DeviceMesh:
    """A (pp, dp, tp) DeviceMesh over the whole world (world size must be pp*dp*tp)."""
    world = dist.get_world_size()
    if world != layout.world:
        raise ValueError(f"world size {world} != pp*dp*tp = {layout.world}; launch "
                         f"{layout.world} processes or change the layout")
    return init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp),
                            mesh_dim_names=("pp", "dp", "tp"))


def split_layers(layers: int, stages: int) -> list[list[int]]:
    """Global layer indices of each pipeline stage, as even as possible (earlier stages get
    the remainder)."""
    base, extra = divmod(layers, stages)
    out, start = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def _clean_name(name: str) -> str:
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(junk, "")
    return name


def _loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (nats), computed in fp32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def tensor_parallelize(model: GPT, tp_mesh: DeviceMesh, sp: bool, tied: bool) -> None:
    """Megatron-style TP of ``model`` in place over ``tp_mesh`` with ``parallelize_module``:
    column-parallel q/k/v and MLP input, row-parallel output projections, a vocabulary-sharded
    embedding and head; ``sp``: sequence parallelism for the norms and residual stream."""
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
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),),
                                                desired_input_layouts=(Replicate(),)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),)),
            })
            if key == "0":  # the replicated embedding sum enters the sharded stream
                plan[""] = PrepareModuleInput(input_layouts=(Replicate(),),
                                              desired_input_layouts=(Shard(1),),
                                              use_local_output=True)
        parallelize_module(block, tp_mesh, plan)


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
        if _is_dtensor(p.grad):
            key = p.grad.device_mesh
        elif hasattr(p, "_st_info") and any(pl.is_shard() for pl in p._st_info.placements):
            key = ("local-shard", p._st_info.mesh)  # TP shard localised for DDP
        else:
            key = None
        groups.setdefault(key, []).append(p)
    sq = torch.zeros((), device=device, dtype=torch.float32)
    for key, ps in groups.items():
        n = torch.nn.utils.get_total_norm([p.grad for p in ps], 2.0, foreach=True)
        if _is_dtensor(n):
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


class Engine:
    """One rank's share of a parallel training run. See the module docstring."""

    def __init__(self, model_cfg: GPTConfig, layout: Layout, mesh: DeviceMesh,
                 device: torch.device, *, seed: int = 0, lr: float = 3e-3,
                 weight_decay: float = 0.0, betas=(0.9, 0.95),
                 grad_clip: float | None = 1.0):
        check_layout(model_cfg, layout)
        self.cfg, self.layout, self.mesh, self.device = model_cfg, layout, mesh, device
        self.grad_clip = grad_clip
        L = layout
        self.dp, self.tp, self.pp = L.dp, L.tp, L.pp
        self.dp_mesh, self.tp_mesh, self.pp_mesh = mesh["dp"], mesh["tp"], mesh["pp"]
        self.dp_rank = self.dp_mesh.get_local_rank()
        self.pp_rank = self.pp_mesh.get_local_rank()
        # FSDP2-family wrappers (fully_shard, replicate) cast with a MixedPrecisionPolicy;
        # classic DDP / ZeRO-1 and no DP wrapper use autocast.
        self.fsdp_family = L.dp > 1 and (L.dp_mode in ("fsdp", "fsdp_grad_op") or (
            L.dp_mode == "ddp" and (L.tp > 1 or L.pp > 1)))
        self.autocast = L.precision == "bf16" and not self.fsdp_family

        # 1. The model (identical weights on every layout), then pipeline split.
        full = self._build_full_model(seed)
        if L.pp > 1:
            split = split_layers(model_cfg.layers, L.stages)
            self.stage_ids = [self.pp_rank + k * L.pp for k in range(L.virtual_stages)]
            chunks = [self._prune(full if len(self.stage_ids) == 1 else copy.deepcopy(full),
                                  split[s], s == 0, s == L.stages - 1)
                      for s in self.stage_ids]
            del full
        else:
            self.stage_ids = [0]
            chunks = [full]

        # 2. TP, checkpointing, compile, DP wrapper -- per chunk.
        self.chunks = [self._parallelize(m) for m in chunks]
        # (name, parameter) recorded now: TP+DDP's forward hooks later swap module attributes
        self.named_params = [(_clean_name(n), p) for m in self.chunks
                             for n, p in m.named_parameters()]
        self.params = [p for _, p in self.named_params]
        # DTensor and plain parameters in separate groups: foreach/fused kernels cannot mix them
        groups = [[p for p in self.params if _is_dtensor(p)],
                  [p for p in self.params if not _is_dtensor(p)]]
        param_groups = [{"params": g} for g in groups if g]

        # 3. Optimizer (fp32 state; fused kernel on CUDA).
        opt_kw = dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        if device.type == "cuda":
            opt_kw["fused"] = True
        else:
            opt_kw["foreach"] = True
        if L.dp_mode == "zero1" and L.dp > 1:
            from torch.distributed.optim import ZeroRedundancyOptimizer
            self.optimizer = ZeroRedundancyOptimizer(
                param_groups, optimizer_class=torch.optim.AdamW,
                process_group=self.dp_mesh.get_group(), **opt_kw)
        else:
            self.optimizer = torch.optim.AdamW(param_groups, **opt_kw)

        # 4. Pipeline schedule.
        self.schedule = None
        if L.pp > 1:
            self._build_schedule()

    # ---------------------------------------------------------------- construction
    def _build_full_model(self, seed: int) -> GPT:
        with torch.device("meta"):
            probe = GPT(self.cfg)
        big = sum(p.numel() for p in probe.parameters()) > CPU_INIT_MAX_PARAMS
        self._meta_init = big and self.device.type != "cpu"
        self._seed = seed
        if self._meta_init:
            return probe
        torch.manual_seed(seed)
        return GPT(self.cfg)

    @staticmethod
    def _prune(model: GPT, layer_ids: list[int], first: bool, last: bool) -> GPT:
        """Keep only one stage's pieces of ``model`` (in place)."""
        for key in list(model.layers.keys()):
            if int(key) not in layer_ids:
                del model.layers[key]
        if not first:
            model.tok_embeddings = None
            model.pos_embeddings = None
        if not last:
            model.norm = None
            model.output = None
        return model

    def _parallelize(self, model: GPT) -> nn.Module:
        L = self.layout
        if L.tp > 1:
            tensor_parallelize(model, self.tp_mesh, self.layout.sequence_parallel,
                               self.cfg.tied_embeddings)
        if L.activation_checkpointing != "none":
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                CheckpointImpl, checkpoint_wrapper)
            for key in list(model.layers.keys()):
                if L.activation_checkpointing == "full" or int(key) % 2 == 0:
                    model.layers[key] = checkpoint_wrapper(
                        model.layers[key], checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        if L.compile:
            for key in list(model.layers.keys()):
                model.layers[key] = torch.compile(model.layers[key])
        if self._meta_init:  # big model on an accelerator: materialise shards, init there
            model.to_empty(device=self.device)
            if self.cfg.tied_embeddings and model.output is not None:
                model.output.weight = model.tok_embeddings.weight
            torch.manual_seed(self._seed)  # DTensor random init needs one seed on all ranks
            with torch.no_grad():
                model.init_weights()
        else:
            model.to(self.device)
        return self._apply_dp(model)

    def _apply_dp(self, model: GPT) -> nn.Module:
        L = self.layout
        if L.dp == 1:
            return model
        bf16 = L.precision == "bf16"
        if self.fsdp_family:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if bf16 else MixedPrecisionPolicy())
            if L.dp_mode in ("fsdp", "fsdp_grad_op"):
                reshard = L.dp_mode == "fsdp"
                for block in model.layers.values():
                    fully_shard(block, mesh=self.dp_mesh, reshard_after_forward=reshard,
                                mp_policy=mp)
                fully_shard(model, mesh=self.dp_mesh, reshard_after_forward=reshard,
                            mp_policy=mp)
                return model
            # ddp with tp > 1 or pp > 1: DTensor-based DDP (FSDP2 machinery, replicate only).
            from torch.distributed._composable.replicate_with_fsdp import replicate
            return replicate(model, mesh=self.dp_mesh, mp_policy=mp)
        from torch.nn.parallel import DistributedDataParallel as DDP
        if L.tp > 1:  # zero1 with TP: DDP over the TP-local shards (PyTorch's TP+DDP recipe)
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform
            _pre_dp_module_transform(model)
        # find_unused_parameters under PP: PipelineStage drives DDP's reducer per micro-batch
        # and DDP's bucket rebuild after the first step then asserts (torch 2.13); finding
        # unused parameters disables the rebuild.
        return DDP(model, process_group=self.dp_mesh.get_group(),
                   device_ids=[self.device.index] if self.device.type == "cuda" else None,
                   find_unused_parameters=L.pp > 1)

    def _build_schedule(self) -> None:
        from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                  ScheduleInterleaved1F1B)
        L = self.layout
        group = self.pp_mesh.get_group()
        self.stages = [PipelineStage(m, s, L.stages, self.device, group=group)
                       for m, s in zip(self.chunks, self.stage_ids)]
        # The loss is divided by the micro-batch count here rather than by the schedule's
        # scale_grads, which walks submod.parameters() and so misses the TP shards that
        # TP+DDP (zero1 with tp > 1) keeps outside the module's parameter list.
        ga = L.grad_accum

        def loss_fn(logits, targets):
            return _loss_fn(logits, targets) / ga

        if L.pp_schedule == "interleaved1f1b":
            self.schedule = ScheduleInterleaved1F1B(self.stages, n_microbatches=ga,
                                                    loss_fn=loss_fn, scale_grads=False)
        else:
            cls = ScheduleGPipe if L.pp_schedule == "gpipe" else Schedule1F1B
            self.schedule = cls(self.stages[0], n_microbatches=ga, loss_fn=loss_fn,
                                scale_grads=False)
        self.has_first = 0 in self.stage_ids
        self.has_last = (L.stages - 1) in self.stage_ids

    # ---------------------------------------------------------------- training
    def _autocast(self):
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """One optimizer step on this DP rank's rows ``tokens`` [micro_batch*grad_accum,
        seq+1]. Returns the mean token cross-entropy (nats, detached 0-dim) where known (last
        pipeline stage), else None."""
        L = self.layout
        rows = L.micro_batch * L.grad_accum
        if tokens.shape[0] != rows:
            raise ValueError(f"train_step got {tokens.shape[0]} rows, layout needs "
                             f"micro_batch*grad_accum={rows}")
        tokens = tokens.to(self.device, non_blocking=True)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if self.schedule is not None:
            loss = self._pp_step(inputs, targets)
        else:
            loss = self._plain_step(inputs, targets)
        self._clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _plain_step(self, inputs, targets) -> torch.Tensor:
        L = self.layout
        model = self.chunks[0]
        ga = L.grad_accum
        total = torch.zeros((), device=self.device)
        is_ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        from torch.distributed.fsdp import FSDPModule
        is_replicate = isinstance(model, FSDPModule) and L.dp_mode in ("ddp", "zero1")
        for i, (x, y) in enumerate(zip(inputs.chunk(ga), targets.chunk(ga))):
            last = i == ga - 1
            ctx = model.no_sync() if (is_ddp and not last) else contextlib.nullcontext()
            if is_replicate:
                model.set_requires_gradient_sync(last)
            with ctx:
                with self._autocast():
                    logits = model(x)
                loss = _loss_fn(logits, y)
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
            return torch.stack([l.detach().float() for l in losses]).sum()  # each is /ga
        return None

    def _clip(self) -> torch.Tensor | None:
        if self.grad_clip is None:
            return None
        return clip_grad_norm_(self.params, self.grad_clip, self.device,
                               self.pp_mesh.get_group() if self.pp > 1 else None)

    # ---------------------------------------------------------------- state
    @torch.no_grad()
    def gathered_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective over the whole world: full unsharded fp32 parameters on CPU, keyed like
        the single-process ``GPT``'s ``state_dict``."""
        local: dict[str, torch.Tensor] = {}
        for name, p in self.named_params:
            if _is_dtensor(p):
                t = p.full_tensor()
            elif hasattr(p, "_st_info"):  # TP shard localised for DDP (zero1 with tp > 1)
                spec = p._st_info
                from torch.distributed.tensor import DTensor

                t = DTensor.from_local(p.detach(), spec.mesh, spec.placements, run_check=False,
                                       shape=spec.shape, stride=spec.stride).full_tensor()
            else:
                t = p
            local[name] = t.detach().float().cpu().clone()
        if self.pp > 1:
            parts: list = [None] * self.pp
            dist.all_gather_object(parts, local, group=self.pp_mesh.get_group())
            for part in parts:
                local.update(part)
        if self.cfg.tied_embeddings and "tok_embeddings.weight" in local:
            local["output.weight"] = local["tok_embeddings.weight"]
        return local

    def close(self) -> None:
        """Drop model, optimizer and schedule references."""
        self.schedule = None
        self.stages = []
        self.optimizer = None
        self.params = []
        self.named_params = []
        self.chunks = []


__all__ = ["Layout", "Engine", "build_mesh", "check_layout", "split_layers", "DP_MODES",
           "PP_SCHEDULES", "AC_MODES", "PRECISIONS"]
