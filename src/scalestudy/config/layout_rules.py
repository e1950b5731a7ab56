"""The shape rules of a point, written once: what the planner skips (``plan.constraints``,
which adds the memory rule) and the trainer's engine refuses to build (:func:`check`, before
any process group work). Each rule returns a sentence with the numbers, or None.

The rules and where they come from:

- the mesh: N = dp·cp·tp·pp with whole numbers, TP inside one node;
- tensor parallelism splits heads, the key/value heads (grouped-query attention: each rank
  holds whole kv heads, as Megatron's ``divide(num_query_groups, tp)`` and torchtitan's
  check require), hidden, the FFN width and the vocabulary evenly, and with sequence
  parallelism the sequence;
- the pipeline: the layers split into pp·virtual_stages stages by ``parallel.pp_partition``
  (``scalestudy.config.partition``: equal stages where the layers divide, balanced by
  parameters, or the stated layers per stage; at least one layer each); ``torch.distributed.pipelining``'s own requirements: 1F1B needs at
  least pp micro-batches, interleaved 1F1B at least pp and a whole number of rounds
  (``grad_accum % (grad_accum // pp) == 0``), virtual stages only with the interleaved
  schedule (and it needs at least 2); embeddings cannot be tied across stages;
- context parallelism: ``cp`` splits every sequence into ``2·cp`` chunks (torch's
  ``context_parallel`` balances the causal work by pairing chunk ``i`` with ``2·cp-1-i``), so
  ``2·cp`` (times ``tp`` with sequence parallelism) divides ``seq_len``; its ring attention
  replaces the fused SDPA kernels of CUDA only (:data:`CP_NEEDS_CUDA`), so not on ``device:
  cpu`` and not with ``attention: math``;
- the batch: every data-parallel rank gets a whole number (>= 1) of micro-batches;
- ZeRO-1 with TP cannot localise a tied weight (PyTorch's TP + DDP recipe); DDP's bucket size
  is DistributedDataParallel's alone (FSDP2's wrappers have none);
- whole nodes, at most ``platform.max_nodes`` of them.
"""

from __future__ import annotations

from typing import Callable

from scalestudy.number_format import plain
from scalestudy.config import partition
from scalestudy.config.point import DPWrapper, Point
from scalestudy.config.vocab import AttentionKernel, Device, DPMode, PPSchedule


class Infeasible(ValueError):
    """A point that cannot run; ``str()`` is the rule's sentence."""


def _is_whole(x) -> bool:
    return float(x).is_integer()


def mesh(p: Point) -> str | None:
    if p.n % (p.cp * p.tp * p.pp):
        if p.cp > 1:
            return f"N={p.n} is not divisible by cp*tp*pp={p.cp * p.tp * p.pp}"
        return f"N={p.n} is not divisible by tp*pp={p.tp * p.pp}"
    if p.tp > p.platform.devices_per_node:
        return (f"tp={p.tp} exceeds devices_per_node={p.platform.devices_per_node} "
                "(tensor parallelism stays inside a node)")
    return None


def tensor_split(p: Point) -> str | None:
    m = p.model
    for what, size in (("heads", m.heads), ("kv_heads", m.n_kv_heads), ("hidden", m.hidden),
                       ("ffn", m.ffn), ("vocab", m.vocab)):
        if size % p.tp:
            return f"tp={p.tp} does not divide {what}={size}"
    if p.parallel.sequence_parallel and m.seq_len % p.tp:
        return f"sequence_parallel needs tp={p.tp} to divide seq_len={m.seq_len}"
    return None


def stages(p: Point) -> str | None:
    v = p.parallel.virtual_stages
    if v > 1 and p.pp == 1:
        return f"virtual_stages={v} needs pp > 1"
    return partition.problem(p)


#: Why torch's context parallelism cannot run on CPU (observed with torch 2.13 on gloo: the
#: ring attention dispatches the CUDA SDPA kernels only).
CP_NEEDS_CUDA = ("torch's context_parallel ring attention covers the CUDA SDPA kernels only "
                 "(on CPU: 'aten._scaled_dot_product_flash_attention_for_cpu.default does not "
                 "have a sharding strategy registered')")


def context(p: Point) -> str | None:
    """Context parallelism's requirements (module doc)."""
    if p.cp == 1:
        return None
    chunks = 2 * p.cp * (p.tp if p.parallel.sequence_parallel else 1)
    if p.model.seq_len % chunks:
        what = "2*cp*tp" if p.parallel.sequence_parallel and p.tp > 1 else "2*cp"
        return (f"cp={p.cp} needs {what}={chunks} to divide seq_len={p.model.seq_len} (the "
                "load-balanced chunks of every sequence)")
    if p.platform.device == Device.CPU:
        return f"cp={p.cp} needs device cuda: {CP_NEEDS_CUDA}"
    if p.model.attention == AttentionKernel.MATH:
        return f"cp={p.cp} needs model.attention fused (the ring attention replaces SDPA's fused kernels)"
    return None


def batch(p: Point) -> str | None:
    """Every data-parallel rank gets a whole number (>= 1) of micro-batches."""
    if not _is_whole(p.dp):
        return None  # reported by mesh()
    dp = int(p.dp)
    if p.global_batch < p.micro_batch * dp:
        return (f"global_batch={plain(p.global_batch)} is smaller than micro_batch*dp="
                f"{p.micro_batch}*{dp}={p.micro_batch * dp}: some data-parallel rank would get "
                "no data")
    if not _is_whole(p.grad_accum):
        return (f"global_batch={plain(p.global_batch)} is not divisible by micro_batch*dp="
                f"{p.micro_batch}*{dp}={p.micro_batch * dp}")
    return None


def schedule(p: Point) -> str | None:
    par, pp, ga = p.parallel, p.pp, p.grad_accum
    interleaved = par.pp_schedule == PPSchedule.INTERLEAVED_1F1B
    if interleaved and par.virtual_stages < 2 and pp > 1:
        return ("pp_schedule=interleaved1f1b needs virtual_stages >= 2 (use 1f1b for one stage "
                "per rank)")
    if not interleaved and par.virtual_stages > 1:
        return f"virtual_stages={par.virtual_stages} needs pp_schedule=interleaved1f1b"
    if pp > 1 and p.model.tied_embeddings:
        return "pp>1 needs tied_embeddings=false (first and last stage would share a weight)"
    if pp > 1 and _is_whole(ga):
        if par.pp_schedule != PPSchedule.GPIPE and ga < pp:
            return (f"pp_schedule={par.pp_schedule} needs at least pp={pp} micro-batches per "
                    f"step, got grad_accum={int(ga)}")
        rounds = max(1, int(ga) // pp)
        if interleaved and ga % rounds:
            return (f"pp_schedule=interleaved1f1b needs grad_accum={int(ga)} to be a multiple of "
                    f"its rounds grad_accum//pp={rounds}")
    return None


def sharding(p: Point) -> str | None:
    if (p.parallel.dp_mode == DPMode.ZERO1 and p.dp_cp > 1 and p.tp > 1
            and p.model.tied_embeddings):
        return ("dp_mode=zero1 with tp>1 needs tied_embeddings=false (use fsdp_grad_op for a "
                "tied model)")
    if (p.parallel.ddp_bucket_cap_mb is not None
            and p.dp_wrapper in (DPWrapper.FULLY_SHARD, DPWrapper.REPLICATE)):
        return (f"ddp_bucket_cap_mb sizes DistributedDataParallel's buckets; this point's "
                f"data parallelism is FSDP2's {p.dp_wrapper.value} (dp_mode="
                f"{p.parallel.dp_mode}, tp={p.tp}, pp={p.pp}): leave it unset")
    return None


def nodes(p: Point) -> str | None:
    per_node = p.platform.devices_per_node
    if p.n > per_node:
        if p.n % per_node:
            return f"N={p.n} does not fill whole nodes of devices_per_node={per_node}"
        if p.n // per_node > p.platform.max_nodes:
            return f"needs {p.n // per_node} nodes, platform.max_nodes={p.platform.max_nodes}"
    return None


#: The shape rules, in the order they are reported (the first broken one is the reason).
RULES: tuple[Callable[[Point], str | None], ...] = (
    mesh, tensor_split, stages, context, batch, schedule, sharding, nodes)


def check(p: Point) -> None:
    """Raise :class:`Infeasible` with the first shape rule ``p`` breaks."""
    for rule in RULES:
        reason = rule(p)
        if reason:
            raise Infeasible(reason)
