"""The study's own model timed block by block in this process (a CPU host's performance
model: ``scalestudy.perf.rates.Measured``'s ``blocks``)."""

from __future__ import annotations

import contextlib
import json

from scalestudy.config.point import DPWrapper
from scalestudy.config.parts import Model
from scalestudy.measure.common import timed_samples
from scalestudy.config.flops import head_forward_flops, layer_forward_flops

#: The blocks ``bench_blocks`` times (seconds per call).
BLOCKS = ("fwd_bwd", "layer", "embedding", "head", "optimizer", "optimizer_layer", "step")
#: And for a spec with ``ddp``: the micro-batch's forward + backward under the trainer's
#: ``DistributedDataParallel`` (a one-rank group), inside ``no_sync`` and with the sync.
DDP_BLOCKS = ("ddp_fwd_bwd", "ddp_sync_fwd_bwd")


def block_spec(model: Model, micro_batch: int, layout: str, ddp: bool = False) -> dict:
    """One entry of ``bench_blocks``'s ``specs`` (JSON-ready): the study's model (every field
    of :class:`Model`), the micro-batch, the layout (``rates.block_layout``) and
    whether to time the ``DDP_BLOCKS`` too (``ddp``; plain layout only)."""
    from dataclasses import asdict

    return {"model": {k: (v.value if hasattr(v, "value") else v)
                      for k, v in asdict(model).items()},
            "micro_batch": int(micro_batch), "layout": layout, "ddp": bool(ddp)}


#: The largest model a calibration times block by block: one micro-batch's forward +
#: backward in FLOPs (``3 ×`` the forward's; about 0.1 s on this project's 2-core hosts).
#: A larger point keeps the product-rate model (its blocks would cost the calibration job
#: minutes and gigabytes: a fault test's 16k-token math-attention model, say).
MAX_BLOCK_FLOPS = 5e9


def block_flops(p) -> float:
    """FLOPs of one micro-batch's forward + backward of ``p``'s whole model (Megatron's
    count: layers, attention over the full ``s × s``, the head)."""
    b = p.micro_batch
    return 3.0 * (p.model.layers * layer_forward_flops(p.model, b)
                  + head_forward_flops(p.model, b))


def block_specs(points) -> list[dict]:
    """The distinct ``block_spec`` of the feasible points (model, micro-batch, layout:
    ``rates.block_layout``) up to ``MAX_BLOCK_FLOPS`` per micro-batch, with ``ddp`` where
    one of its points runs under ``DistributedDataParallel`` in the plain layout."""
    from scalestudy.perf.rates import block_layout

    out: dict = {}
    for p in points:
        if not p.feasible or block_flops(p) > MAX_BLOCK_FLOPS:
            continue
        layout = block_layout(p)
        spec = block_spec(p.model, p.micro_batch, layout)
        key = json.dumps(spec, sort_keys=True)
        spec = out.setdefault(key, spec)
        spec["ddp"] |= layout == "plain" and p.dp_wrapper == DPWrapper.DDP
    return list(out.values())


def bench_blocks(specs: list[dict], samples: int = 15, warmup: int = 3,
                 min_time_s: float = 0.02) -> list[dict]:
    """The study's own model, timed piece by piece in this process at its micro-batch shape,
    as the trainer runs it (fp32 cross-entropy, foreach AdamW, the project's gradient
    clipping), every piece on the same model (the study's layer count): ``fwd_bwd`` the
    whole micro-batch (embedding, layers, final norm, head, loss; forward and backward);
    ``layer`` one transformer layer's forward and backward alone; ``embedding`` the token
    (and position) embeddings'; ``head`` the final norm, head and loss; ``optimizer``
    clipping + AdamW step over all parameters; ``optimizer_layer`` the same over one layer's;
    ``step`` a whole one-micro-batch step as the trainer runs it (the micro-batch on freshly
    cleared gradients, clipping, AdamW, ``zero_grad(set_to_none=True)``): the optimizer
    after a backward, its caches as a step leaves them (``host.in_step_optimizer``).
    The blocks are sampled in rounds (one sample of each block per round), so a drift of the
    host's speed during the job reaches every block alike.
    ``tp<d>`` layout: the model under ``tensor_parallelize`` as rank 0 of a ``d``-rank mesh
    on torch's ``fake`` process group (``spec_process_group``): that rank's share of the
    arithmetic and DTensor's whole path of every exchange (the functional collective, its
    wrapper tensor, the wait, the autograd hooks), without the communication itself, which
    the model adds from the measured collectives. (On a one-rank mesh DTensor skips every
    exchange.) A spec with ``ddp`` adds ``DDP_BLOCKS`` to each round: a copy of the model
    under ``data_parallel.distributed_data_parallel`` on a one-rank group (no peer, so its
    all-reduce is a local copy), the micro-batch inside ``no_sync`` and with the gradient
    sync: the wrapper's own cost (``host.ddp_wrapper_seconds``). Rows ``key, layout,
    micro_batch, block, sample, seconds`` (``key``: ``rates.block_key``; each sample
    repeats the call for ``min_time_s``); the model uses the median over samples
    (``rates.blocks_from_rows``). Runs outside any process group: it makes its own."""
    from scalestudy.perf.rates import block_key, block_layout_tp

    rows: list[dict] = []
    for spec in specs:
        cfg = Model(**spec["model"])
        b, layout, ddp = int(spec["micro_batch"]), spec["layout"], bool(spec.get("ddp"))
        if ddp and layout != "plain":
            raise ValueError(f"ddp blocks are timed in the plain layout, not {layout!r}")
        key = block_key(cfg, cfg.seq_len, b, layout)
        with spec_process_group(block_layout_tp(layout), ddp) as mesh:
            for block, secs in _block_samples(cfg, b, mesh, samples, warmup, min_time_s, ddp):
                rows += [{"key": key, "layout": layout, "micro_batch": b, "block": block,
                          "sample": i, "seconds": t} for i, t in enumerate(secs)]
    return rows


@contextlib.contextmanager
def spec_process_group(tp: int, ddp: bool):
    """The process group one ``bench_blocks`` spec is timed in, this process its rank 0,
    destroyed after it: for ``tp > 1`` torch's ``fake`` backend with ``tp`` ranks (every
    collective returns at once, its output filled from this rank's input), yielding the
    ``tp``-rank device mesh; for ``ddp`` a one-rank ``gloo`` group; else none. Yields the mesh
    or None. Raises ``RuntimeError`` inside another process group."""
    import torch.distributed as dist

    if tp <= 1 and not ddp:
        yield None
        return
    if dist.is_initialized():
        raise RuntimeError("bench_blocks makes the process group of its DTensor and DDP blocks: "
                           "call it outside torch.distributed")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("fake" if tp > 1 else "gloo", store=dist.HashStore(), rank=0,
                            world_size=max(tp, 1))
    try:
        yield init_device_mesh("cpu", (tp,)) if tp > 1 else None
    finally:
        dist.destroy_process_group()


def _block_samples(cfg: Model, b: int, mesh, samples: int, warmup: int, min_time_s: float,
                   ddp: bool = False) -> list:
    import torch

    from scalestudy.distributed.clipping import clip_grad_norm_
    from scalestudy.distributed.engine import loss_fn
    from scalestudy.distributed.mesh import is_dtensor
    from scalestudy.distributed.tensor_parallel import tensor_parallelize
    from scalestudy.models import build_model

    torch.manual_seed(0)
    model = build_model(cfg)
    if mesh is not None:
        tensor_parallelize(model, mesh, False, cfg.tied_embeddings)
    cpu = torch.device("cpu")

    def adamw(params):
        groups = [g for g in ([p for p in params if is_dtensor(p)],
                              [p for p in params if not is_dtensor(p)]) if g]
        return torch.optim.AdamW([{"params": g} for g in groups], lr=1e-4, foreach=True)

    params = [p for p in model.parameters() if p.requires_grad]
    layer = next(iter(model.layers.values()))
    lparams = [p for p in layer.parameters() if p.requires_grad]
    opt, lopt = adamw(params), adamw(lparams)
    tokens = torch.randint(cfg.vocab, (b, cfg.seq_len + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    h = torch.randn(b, cfg.seq_len, cfg.hidden, requires_grad=True)

    def fwd_bwd():
        loss_fn(model(x), y).backward()

    extra = (model.rope,) if hasattr(model, "rope") else ()  # Llama's blocks take the table

    def one_layer():
        layer(h, *extra).sum().backward()

    def embedding():
        e = model.tok_embeddings(x)
        if getattr(model, "pos_embeddings", None) is not None:
            e = e + model.pos_embeddings(torch.arange(cfg.seq_len))
        e.sum().backward()

    def head():
        loss_fn(model.output(model.norm(h)), y).backward()

    def optimizer():
        clip_grad_norm_(params, 1.0, cpu)
        opt.step()

    def optimizer_layer():
        clip_grad_norm_(lparams, 1.0, cpu)
        lopt.step()

    def step():
        fwd_bwd()
        optimizer()
        opt.zero_grad(set_to_none=True)

    calls = dict(zip(BLOCKS, (fwd_bwd, one_layer, embedding, head, optimizer, optimizer_layer,
                              step)))
    if ddp:
        import torch.distributed as dist

        from scalestudy.distributed.data_parallel import distributed_data_parallel

        torch.manual_seed(0)
        wrapped = distributed_data_parallel(build_model(cfg), dist.group.WORLD, cpu)

        def ddp_fwd_bwd(sync: bool):
            with contextlib.nullcontext() if sync else wrapped.no_sync():
                loss_fn(wrapped(x), y).backward()

        calls |= dict(zip(DDP_BLOCKS, (lambda: ddp_fwd_bwd(False), lambda: ddp_fwd_bwd(True))))
    out = {name: [] for name in calls}
    for i in range(samples):  # rounds: one sample of every block each
        for name, call in calls.items():
            out[name] += timed_samples(call, cpu, warmup if i == 0 else 0, 1, min_time_s)
    return list(out.items())
