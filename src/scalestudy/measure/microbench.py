"""Building-block measurements, runnable as DAG jobs; each writes one tidy CSV atomically.

    python -m scalestudy.measure.microbench matmul --out matmul.csv [--sizes 256 512] [--dtypes fp32 bf16]
    torchrun --nproc-per-node 4 -m scalestudy.measure.microbench collectives --out coll.csv \
        [--sizes 4096 1048576] [--group-sizes 2 4] [--ops all_reduce all_gather ...]
    python -m scalestudy.measure.microbench memory --out mem.csv      # estimate vs measured peak (CPU)

``matmul`` rows: ``device, device_name, dtype, m, n, k, sample, seconds, flops_per_s`` (one row
per timed sample; 2·m·n·k FLOPs per call; the device is synchronised before every clock read
and warm-up calls are not recorded).

``collectives`` rows: ``op, backend, device, world_size, group_size, bytes, sample, seconds,
algbw_Bps, busbw_Bps``. ``bytes`` is the size of the full buffer (the all-reduce buffer, the
all-gather output, the reduce-scatter input, the point-to-point message); ``seconds`` is the
slowest rank's time per call (one-way for send/recv, half a round trip). Bus bandwidth
follows nccl-tests: all-reduce ``2(p-1)/p``, all-gather and reduce-scatter ``(p-1)/p``,
send/recv 1 times the algorithmic bandwidth ``bytes / seconds``.

``memory [--trainer]`` runs a few tiny fp32 GPT training steps in fresh subprocesses (with
``--trainer`` also ``scalestudy.train`` under torchrun for ddp / zero1 / fsdp) and compares the
peak resident memory above a baseline (``VmHWM`` after resetting it through
``/proc/self/clear_refs``; glibc is told to serve every allocation over 64 KiB by ``mmap``
so freed tensors leave the resident set) with ``scalestudy.memory.estimate``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scalestudy.config.point import DPWrapper, Model, Point, identify
from scalestudy.config.vocab import DType, allowed
from scalestudy.perf.flops import head_forward_flops, layer_forward_flops

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "send_recv": lambda p: 1.0,
}


def _write_rows(path: str | os.PathLike, rows: list[dict]) -> None:
    import pandas as pd

    from scalestudy.record.io import atomic_path

    with atomic_path(path) as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)


#: Slices of a sweep's collectives measurement (jobs of their own among the runs, rule
#: ``microbench_collectives_slice``) and samples in each: 3 x 5, as many as one job of 15.
COLLECTIVE_SLICES = 3
COLLECTIVE_SLICE_SAMPLES = 5


def pool_slices(paths: list[str], out: str, log: str | None = None) -> None:
    """The rows of every slice's CSV in one CSV (``slice``: the index in ``paths``), written
    atomically to ``out`` (and a line saying so to ``log``): a collective timed in one moment
    of a shared host is one draw of its speed (the 64 KB all-reduce between two ranks took a
    median of 1.4-4.1 ms in four jobs of one day), the slices sample it across the sweep."""
    import pandas as pd

    from scalestudy.record.io import write_text

    frames = [pd.read_csv(p).assign(slice=k) for k, p in enumerate(paths)]
    _write_rows(out, pd.concat(frames, ignore_index=True).to_dict("records"))
    if log:
        write_text(log, f"{out}: {len(paths)} slices pooled\n")


def _device(name: str | None):
    import torch

    from scalestudy.train.device import resolve_device_type

    return torch.device(resolve_device_type(name or "auto"))


def _sync(device) -> None:
    from scalestudy.train.device import sync

    sync(device)


def _device_name(device) -> str:
    from scalestudy.train.device import detect_device

    return detect_device(device.type)["device_name"]


def _torch_dtype(name: str):
    from scalestudy.train.device import TORCH_DTYPES

    try:
        return TORCH_DTYPES[DType(name)]
    except ValueError:
        raise ValueError(f"--dtypes {name!r} is not supported; use one of "
                         f"{allowed(DType)}") from None


# --- matmul ---------------------------------------------------------------------------------


def timed_samples(call, device, warmup: int, samples: int, min_time_s: float) -> list[float]:
    """Seconds per ``call()``: ``samples`` measurements, each repeating the call until
    ``min_time_s`` has passed, after ``warmup`` untimed calls; the device is synchronised
    before every clock read."""
    for _ in range(warmup):
        call()
    _sync(device)
    t0 = time.perf_counter()
    call()
    _sync(device)
    reps = max(1, int(min_time_s / max(time.perf_counter() - t0, 1e-7)))
    return [seconds_per_call(call, device, reps) for _ in range(samples)]


def seconds_per_call(call, device, reps: int) -> float:
    """Seconds per ``call()`` over ``reps`` back-to-back calls, the device synchronised before
    both clock reads."""
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    _sync(device)
    return (time.perf_counter() - t0) / reps


def bench_matmul(
    shapes: list[tuple[int, int, int]], dtypes: list[str], device=None, warmup: int = 2,
    samples: int = 5, min_time_s: float = 0.05, budget_s: float = 25.0,
) -> list[dict]:
    """Time ``A[m,k] @ B[k,n]`` for every shape and dtype; one row per sample. Each sample
    repeats the call until ``min_time_s`` has passed; stops early after ``budget_s``."""
    import torch

    device = _device(device)
    t_start = time.perf_counter()
    rows = []
    for dt in dtypes:
        dtype = _torch_dtype(dt)
        if dt == DType.FP16 and device.type == "cpu":
            continue  # pathologically slow on CPU (minutes per product); skipped, not guessed
        for m, n, k in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            secs = timed_samples(lambda: torch.mm(a, b), device, warmup, samples, min_time_s)
            for i, dt_s in enumerate(secs):
                rows.append({
                    "device": device.type, "device_name": _device_name(device), "dtype": dt,
                    "m": m, "n": n, "k": k, "sample": i, "seconds": dt_s,
                    "flops_per_s": 2.0 * m * n * k / dt_s,
                })
            if time.perf_counter() - t_start > budget_s:
                return rows
    return rows


# --- collectives ----------------------------------------------------------------------------


def bench_collectives(
    sizes: list[int], group_sizes: list[int] | None = None, ops: tuple[str, ...] = OPS,
    warmup: int = 2, samples: int = 15, min_time_s: float = 0.02, budget_s: float = 25.0,
) -> list[dict]:
    """Time collectives on sub-groups of the first ``g`` ranks of the initialised default
    process group (call from every rank). Returns rows on rank 0, ``[]`` elsewhere.
    ``samples`` of ≳ ``min_time_s`` each: on a small shared CPU host one sample of a small
    gloo collective takes 0.5-2.7 ms from one to the next (whether its ranks share a core
    or wait for an idle one to wake), so a median of 5 moved 1.6x between two jobs."""
    import torch
    import torch.distributed as dist

    world, rank = dist.get_world_size(), dist.get_rank()
    backend = dist.get_backend()
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    group_sizes = sorted({g for g in (group_sizes or [world]) if 2 <= g <= world})
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    t_start = time.perf_counter()
    rows: list[dict] = []
    stop = torch.zeros(1, device=device)
    for g in group_sizes:
        ranks = list(range(g))
        group = dist.new_group(ranks)  # every rank must call new_group
        member = rank < g
        for op in ops:
            if op not in OPS:
                raise ValueError(f"--ops {op!r} is not supported; use one of {', '.join(OPS)}")
            for nbytes in sizes:
                numel = max(g, nbytes // 4 // g * g)
                if member:
                    buf = torch.ones(numel, device=device)
                    part = torch.empty(numel // g, device=device)
                    peer = rank ^ 1 if (rank ^ 1) < g else rank

                    def call():
                        if op == "all_reduce":
                            dist.all_reduce(buf, group=group)
                        elif op == "all_gather":
                            ag(buf, part, group=group)
                        elif op == "reduce_scatter":
                            rs(part, buf, group=group)
                        elif peer != rank:  # ping-pong between rank pairs (0,1), (2,3), ...
                            if rank % 2 == 0:
                                dist.send(buf, peer)
                                dist.recv(buf, peer)
                            else:
                                dist.recv(buf, peer)
                                dist.send(buf, peer)

                    for _ in range(warmup):
                        call()
                    _sync(device)
                dist.barrier()
                # the repetition count is agreed on rank 0's probe so all members loop alike
                reps_t = torch.ones(1, device=device)
                if member:
                    _sync(device)
                    t0 = time.perf_counter()
                    call()
                    _sync(device)
                    reps_t.fill_(max(1, min(1000, int(min_time_s / max(time.perf_counter() - t0, 1e-7)))))
                dist.broadcast(reps_t, 0)
                reps = int(reps_t.item())
                for i in range(samples):
                    dist.barrier()
                    elapsed = torch.zeros(1, device=device, dtype=torch.float64)
                    if member:
                        elapsed.fill_(seconds_per_call(call, device, reps))
                    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
                    sec = elapsed.item() / (2 if op == "send_recv" else 1)
                    full = numel * 4  # buf: the all-gather output / reduce-scatter input
                    algbw = full / sec if sec > 0 else float("nan")
                    if rank == 0:
                        rows.append({
                            "op": op, "backend": backend, "device": device.type,
                            "world_size": world, "group_size": g, "bytes": full, "sample": i,
                            "seconds": sec, "algbw_Bps": algbw,
                            "busbw_Bps": algbw * BUS_FACTOR[op](g),
                        })
                # a shared stop decision keeps every rank in the same loop iteration
                stop.fill_(1.0 if time.perf_counter() - t_start > budget_s else 0.0)
                dist.broadcast(stop, 0)
                if stop.item():
                    return rows
    return rows


# --- memory check ---------------------------------------------------------------------------

MEMORY_CASES = {
    # name: (model, micro_batch, activation_checkpointing) — fp32, one process
    "state": (dict(vocab=4096, seq_len=64, layers=4, hidden=256, heads=4), 2, "none"),
    "activations": (dict(vocab=512, seq_len=256, layers=4, hidden=128, heads=4), 16, "none"),
    "activations_full_ckpt": (dict(vocab=512, seq_len=256, layers=4, hidden=128, heads=4), 16, "full"),
}


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _memory_child(spec: dict) -> dict:
    """Runs in a fresh process: peak resident bytes above the baseline over ``steps`` AdamW
    steps of a GPT (fp32)."""
    import gc

    import torch
    from torch.utils.checkpoint import checkpoint

    from scalestudy.models.gpt import GPT

    torch.manual_seed(0)
    cfg = Model(**spec["model"])
    b, s = spec["micro_batch"], cfg.seq_len
    tokens = torch.randint(cfg.vocab, (b, s + 1))

    def step(model, opt, ckpt):
        x, y = tokens[:, :-1], tokens[:, 1:]
        pos = torch.arange(s)
        h = model.tok_embeddings(x) + model.pos_embeddings(pos)
        for layer in model.layers.values():
            h = checkpoint(layer, h, use_reentrant=False) if ckpt == "full" else layer(h)
        logits = model.output(model.norm(h))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # warm up kernels and libraries on a tiny model so their one-off buffers are in the baseline
    small = GPT(Model(vocab=cfg.vocab, seq_len=s, layers=1, hidden=32, heads=2))
    o = torch.optim.AdamW(small.parameters())
    saved = tokens
    tokens = tokens[:1]
    step(small, o, spec["ckpt"])
    tokens = saved
    del small, o
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident set
    base = _vm("VmRSS")
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    for _ in range(spec.get("steps", 3)):
        step(model, opt, spec["ckpt"])
    peak = _vm("VmHWM")
    return {"measured_bytes": peak - base, "baseline_bytes": base}


def memory_point(model: dict, micro_batch: int, ckpt: str, **options) -> Point:
    """The point of a one-process fp32 run of ``model`` (a dict of :class:`Model` fields);
    ``options`` as in :meth:`Point.for_layout`."""
    return Point.for_layout(Model(**model), micro_batch=micro_batch,
                            activation_checkpointing=ckpt, **options)


def bench_memory(cases: dict | None = None, timeout_s: float = 120) -> list[dict]:
    """Measured peak vs ``memory.estimate`` for each case (fresh subprocess each)."""
    from scalestudy.perf import memory

    rows = []
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
           "OMP_NUM_THREADS": "1"}
    for name, (model, mb, ckpt) in (cases or MEMORY_CASES).items():
        spec = {"model": model, "micro_batch": mb, "ckpt": ckpt, "steps": 3}
        out = subprocess.run(
            [sys.executable, "-m", "scalestudy.measure.microbench", "_memory_child", json.dumps(spec)],
            env=env, capture_output=True, text=True, timeout=timeout_s, check=True,
        )
        meas = json.loads(out.stdout.strip().splitlines()[-1])
        est = memory.estimate(memory_point(model, mb, ckpt))
        row = {"case": name, "activation_checkpointing": ckpt, "micro_batch": mb, **model}
        row.update({f"est_{k}": est[k] for k in memory.COMPONENTS})
        row["est_total_bytes"] = est["total_bytes"]
        row["measured_bytes"] = meas["measured_bytes"]
        row["baseline_bytes"] = meas["baseline_bytes"]
        row["rel_error"] = (est["total_bytes"] - meas["measured_bytes"]) / meas["measured_bytes"]
        rows.append(row)
    return rows


# --- framework overhead ---------------------------------------------------------------------


def bench_overhead(layers=(1, 4), samples: int = 15, warmup: int = 3,
                   layouts=("plain", "tp")) -> list[dict]:
    """Per-operation framework overhead, measured on a degenerate GPT (hidden 8, seq 8,
    vocab 16, one sequence: its arithmetic is negligible, so the time is dispatch, autograd
    and optimizer bookkeeping). ``layouts``: ``plain`` tensors, and ``tp``: the model under
    ``scalestudy.parallel.tensor_parallelize`` on a one-rank mesh, i.e. DTensor's per-op
    dispatch without any communication (the collectives are modelled apart). The optimizer
    phase is gradient clipping + AdamW step + zero_grad, as the trainer does. Rows ``layout,
    phase (fwd_bwd | optimizer), layers, sample, seconds``; a linear fit over ``layers``
    gives a fixed and a per-layer cost per layout."""
    import tempfile

    import torch.distributed as dist

    from scalestudy.models.gpt import GPT

    rows = []
    own_group = "tp" in layouts and not dist.is_initialized()
    with tempfile.TemporaryDirectory() as tmp:
        if own_group:  # a one-rank group through a file store: no port, no peer
            dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1),
                                    rank=0, world_size=1)
        try:
            for layout in layouts:
                for L in layers:
                    rows += _overhead_samples(GPT, Model(vocab=16, seq_len=8, layers=L,
                                                         hidden=8, heads=2),
                                              layout, samples, warmup)
        finally:
            if own_group:
                dist.destroy_process_group()
    return rows


def _overhead_samples(GPT, cfg, layout: str, samples: int, warmup: int) -> list[dict]:
    import torch

    from scalestudy.distributed.clipping import clip_grad_norm_
    from scalestudy.distributed.tensor_parallel import tensor_parallelize

    torch.manual_seed(0)
    model = GPT(cfg)
    if layout == "tp":
        from torch.distributed.device_mesh import init_device_mesh

        tensor_parallelize(model, init_device_mesh("cpu", (1,)), False, cfg.tied_embeddings)
    elif layout != "plain":
        raise ValueError(f"overhead layout {layout!r} is not supported; use plain or tp")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    x = torch.randint(cfg.vocab, (1, cfg.seq_len + 1))
    rows = []
    for i in range(warmup + samples):
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab).float(),
                                                 x[:, 1:].reshape(-1))
        loss.backward()
        t1 = time.perf_counter()
        clip_grad_norm_(params, 1.0, torch.device("cpu"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if i >= warmup:
            base = {"layout": layout, "layers": cfg.layers, "sample": i - warmup}
            rows.append(base | {"phase": "fwd_bwd", "seconds": t1 - t0})
            rows.append(base | {"phase": "optimizer", "seconds": t2 - t1})
    return rows


# --- the study's own building blocks (a CPU host's performance model) -----------------------

#: The blocks ``bench_blocks`` times (seconds per call).
BLOCKS = ("fwd_bwd", "layer", "embedding", "head", "optimizer", "optimizer_layer", "step")
#: And for a spec with ``ddp``: the micro-batch's forward + backward under the trainer's
#: ``DistributedDataParallel`` (a one-rank group), inside ``no_sync`` and with the sync.
DDP_BLOCKS = ("ddp_fwd_bwd", "ddp_sync_fwd_bwd")


def block_spec(model: Model, micro_batch: int, layout: str, ddp: bool = False) -> dict:
    """One entry of ``bench_blocks``'s ``specs`` (JSON-ready): the study's model (every field
    of :class:`Model`), the micro-batch, the layout (``stepmodel.block_layout``) and
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
    ``stepmodel.block_layout``) up to ``MAX_BLOCK_FLOPS`` per micro-batch, with ``ddp`` where
    one of its points runs under ``DistributedDataParallel`` in the plain layout."""
    from scalestudy.perf.stepmodel import block_layout

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
    after a backward, its caches as a step leaves them (``stepmodel.in_step_optimizer``).
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
    sync: the wrapper's own cost (``stepmodel.ddp_wrapper_seconds``). Rows ``key, layout,
    micro_batch, block, sample, seconds`` (``key``: ``stepmodel.block_key``; each sample
    repeats the call for ``min_time_s``); the model uses the median over samples
    (``stepmodel.blocks_from_rows``). Runs outside any process group: it makes its own."""
    from scalestudy.perf.stepmodel import block_key, block_layout_tp

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


def forked(ctx, target, args: list[tuple], timeout_s: float = 600) -> list:
    """Run ``target(*a, queue)`` for every ``a`` of ``args`` in processes of the
    multiprocessing context ``ctx``, all at once; what each puts on its queue, in the order
    they finish."""
    queue = ctx.Queue()
    kids = [ctx.Process(target=target, args=(*a, queue)) for a in args]
    for c in kids:
        c.start()
    got = [queue.get(timeout=timeout_s) for _ in kids]
    for c in kids:
        c.join()
    return got


def _sharing_work():
    """``bench_core_sharing``'s fixed work: one call of a small transformer layer's forward
    and backward (hidden 64, 4 heads, 4 sequences of 64 tokens)."""
    import torch

    from scalestudy.models.gpt import Block

    torch.manual_seed(0)
    layer = Block(Model(layers=1, hidden=64, heads=4, seq_len=64, vocab=256))
    x = torch.randn(4, 64, 64, requires_grad=True)
    return lambda: layer(x).sum().backward()


def _sharing_child(threads: int, reps: int, barrier, queue) -> None:
    import torch

    torch.set_num_threads(threads)
    work = _sharing_work()
    for _ in range(3):
        work()
    barrier.wait()
    t0 = time.perf_counter()
    for _ in range(reps):
        work()
    queue.put(time.perf_counter() - t0)


def bench_core_sharing(procs=(1, 2, 4, 8), work_s: float = 0.15, samples: int = 5) -> list[dict]:
    """What sharing this host's cores costs: ``k`` processes, each with this process's torch
    threads (a point's process's share), run the same fixed work at once (``_sharing_work``
    repeated for ``work_s`` of one process alone), started together at a barrier. Rows
    ``procs, sample, seconds`` (the slowest process's wall time) and ``factor`` (that over the
    one-process time of the same round, so that the host's drift between rounds cancels): the
    slowdown each process of a ``k``-process job sees (``stepmodel.core_sharing_slowdown``).
    The host's own other load is in it, as it is in the study's runs; ``load_1m`` records it.
    The processes start from a fork server that has only imported torch: a process forked
    after torch ran with several threads hangs in its first parallel region (OpenMP)."""
    import multiprocessing as mp

    import torch

    work = _sharing_work()
    for _ in range(3):
        work()
    t0 = time.perf_counter()
    for _ in range(5):
        work()
    reps = max(1, int(work_s / ((time.perf_counter() - t0) / 5)))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", __name__])
    threads = torch.get_num_threads()
    raw: list[tuple[int, int, float]] = []
    for i in range(samples):
        for k in procs:
            barrier = ctx.Barrier(k)
            times = forked(ctx, _sharing_child, [(threads, reps, barrier)] * k)
            raw.append((k, i, max(times)))
    one = {i: t for k, i, t in raw if k == min(procs)}
    load = os.getloadavg()[0]
    return [{"procs": k, "sample": i, "seconds": t, "factor": t / one[i], "load_1m": load}
            for k, i, t in raw]


#: Compute between two synchronisations (s of one process alone) at which ``bench_sync_wait``
#: measures: a tensor-parallel exchange every ~half layer, a pipeline transfer, a DDP step.
SYNC_GRAINS = (5e-4, 2e-3, 8e-3)


def _sync_child(rank: int, k: int, store: str, per_call_s: float, grains, phase_s: float,
                queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store, k), rank=rank, world_size=k)
    a, b, x = torch.randn(128, 128), torch.randn(128, 128), torch.zeros(1)

    def work(n):
        for _ in range(n):
            a @ b

    for _ in range(5):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(50):
        dist.all_reduce(x)
    alpha = (time.perf_counter() - t0) / 50
    out = []
    for g in grains:
        n, reps = max(1, round(g / per_call_s)), max(5, int(phase_s / g))
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            work(n)
        alone = (time.perf_counter() - t0) / reps
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            work(n)
            dist.all_reduce(x)
        out.append((g, alone, (time.perf_counter() - t0) / reps))
    queue.put((alpha, out))
    dist.barrier()
    dist.destroy_process_group()


def bench_sync_wait(procs=(2, 4), grains=SYNC_GRAINS, samples: int = 3,
                    phase_s: float = 0.1) -> list[dict]:
    """What one synchronisation costs ``k`` processes that share this host's cores, beyond
    the collective's own latency: ``k`` forked one-thread processes in a gloo group each run
    the same chunks of work (``grain_s`` of one process alone: 128³ matmuls), first back to
    back, then each chunk followed by a 4-byte all-reduce. Per chunk, the synchronised loop
    takes longer than the free one by the back-to-back all-reduce latency (``alpha_s``) and
    by the wait for the slowest process (``wait_s``: a process descheduled or slowed by the
    others holds every one up; it grows with the chunk and with ``k`` over the cores). Rows
    ``procs, grain_s, sample, alone_s, synced_s, alpha_s, wait_s`` (means over the ranks;
    ``scalestudy.perf.stepmodel.sync_wait_seconds`` reads ``wait_s``)."""
    import multiprocessing as mp
    import tempfile

    import torch

    a, b = torch.randn(128, 128), torch.randn(128, 128)
    for _ in range(20):
        a @ b
    t0 = time.perf_counter()
    for _ in range(200):
        a @ b
    per_call = (time.perf_counter() - t0) / 200
    ctx = mp.get_context("fork")
    rows: list[dict] = []
    for i in range(samples):
        for k in sorted({int(k) for k in procs if int(k) >= 2}):
            with tempfile.TemporaryDirectory() as tmp:
                got = forked(ctx, _sync_child, [(r, k, f"{tmp}/store", per_call, grains,
                                                 phase_s) for r in range(k)])
            alpha = statistics.mean(a for a, _ in got)
            for j, g in enumerate(grains):
                alone = statistics.mean(o[j][1] for _, o in got)
                synced = statistics.mean(o[j][2] for _, o in got)
                rows.append({"procs": k, "grain_s": g, "sample": i, "alone_s": alone,
                             "synced_s": synced, "alpha_s": alpha,
                             "wait_s": synced - alone - alpha})
    return rows


# --- attention kernel and memory bandwidth --------------------------------------------------


def bench_attention(shapes: list[tuple[int, int, int, int]], dtypes: list[str], device=None,
                    warmup: int = 2, samples: int = 3, min_time_s: float = 0.02) -> list[dict]:
    """Forward + backward of causal ``scaled_dot_product_attention`` (the kernel PyTorch
    picks) for ``(batch, heads, seq, head_dim)`` shapes. ``flops_per_s`` counts the full
    ``s × s`` products, ``3 · 4·s²·head_dim`` per batch·head (Megatron's convention), so it
    is directly comparable with matmul rates."""
    import torch
    import torch.nn.functional as F

    device = _device(device)
    rows = []
    for dt in dtypes:
        if dt == "fp16" and device.type == "cpu":
            continue
        dtype = _torch_dtype(dt)
        for b, a, s, hd in shapes:
            q, k, v = (torch.randn(b, a, s, hd, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            g = torch.ones(b, a, s, hd, device=device, dtype=dtype)

            def call():
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y.backward(g)

            for i, sec in enumerate(timed_samples(call, device, warmup, samples, min_time_s)):
                rows.append({"device": device.type, "dtype": dt, "batch_heads": b * a, "seq": s,
                             "head_dim": hd, "sample": i, "seconds": sec,
                             "flops_per_s": 3 * 4.0 * s * s * hd * b * a / sec})
    return rows


def bench_bandwidth(nbytes: int = 64 * 2**20, device=None, samples: int = 5) -> list[dict]:
    """Device memory bandwidth of a tensor copy: ``2 · nbytes`` (read + write) per copy."""
    import torch

    device = _device(device)
    x = torch.ones(nbytes // 4, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    rows = []
    for i in range(samples):
        sec = seconds_per_call(lambda: y.copy_(x), device, 1)
        rows.append({"device": device.type, "bytes": nbytes, "sample": i, "seconds": sec,
                     "bytes_per_s": 2 * nbytes / sec})
    return rows


# --- predicted vs measured step time (CPU, one process) -------------------------------------

VALIDATE_CASES = {
    # name: (model, micro_batch): fp32, one process, plain training loop of scalestudy.model.GPT
    "tiny-b2": (dict(vocab=256, seq_len=64, layers=2, hidden=64, heads=4), 2),
    "tiny-b8": (dict(vocab=256, seq_len=64, layers=2, hidden=64, heads=4), 8),
    "small-h128": (dict(vocab=512, seq_len=128, layers=4, hidden=128, heads=4), 8),
    "small-h256": (dict(vocab=1024, seq_len=128, layers=4, hidden=256, heads=4), 4),
}


def time_training_step(model_cfg: dict, micro_batch: int, steps: int = 10, warmup: int = 3,
                       stat: str = "best") -> float:
    """Seconds of one AdamW step (forward, backward, step) of ``GPT(model_cfg)`` in this
    process (fp32), warm-up steps dropped; ``best`` (fastest) or ``median`` step."""
    import torch

    from scalestudy.models.gpt import GPT

    torch.manual_seed(0)
    cfg = Model(**model_cfg)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(cfg.vocab, (micro_batch, cfg.seq_len + 1))
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return min(times) if stat == "best" else statistics.median(times)


def bench_validate(cases: dict | None = None) -> list[dict]:
    """For each case: measure its matmul shapes and the framework overhead, predict the
    step time with ``scalestudy.perf.stepmodel`` from those building blocks, then time the real step; the
    measurements are interleaved so that they share the host's load, and every figure is
    the fastest sample (contention on a shared host only ever adds time)."""
    from scalestudy.perf import stepmodel

    hw = stepmodel.HardwareSpec.load("cpu-local")
    rows = []
    for name, (model, mb) in (cases or VALIDATE_CASES).items():
        point = memory_point(model, mb, "none")
        s, h = model["seq_len"], model["hidden"]
        shapes = {(int(M), int(N), int(K))
                  for M, N, K, _ in stepmodel.layer_gemms(point.model, s, mb)}
        shapes.add(tuple(int(x) for x in stepmodel.head_gemm(point.model, s, mb)[:3]))
        mm = bench_matmul(sorted(shapes), ["fp32"], "cpu", samples=3, min_time_s=0.02)
        att = bench_attention([(mb, model["heads"], s, h // model["heads"])], ["fp32"], "cpu")
        ovh = bench_overhead(samples=5, layouts=("plain",))
        bw = bench_bandwidth(16 * 2**20, "cpu")
        measured = stepmodel.Measured.from_frames(mm, None, ovh, att, bw, stat="best")
        pred = stepmodel.predict_step_time(point, hw, measured)
        t = time_training_step(model, mb)
        rows.append({"case": name, "micro_batch": mb, **model,
                     "predicted_s": pred.step_time_s, "compute_s": pred.compute_s,
                     "gemm_s": pred.gemm_s, "attention_s": pred.attention_s,
                     "elementwise_s": pred.elementwise_s, "overhead_s": pred.overhead_s,
                     "optimizer_s": pred.optimizer_s,
                     "measured_s": t, "rel_error": (pred.step_time_s - t) / t})
    return rows


# --- plots ----------------------------------------------------------------------------------


def plot(kind: str, csv: str | os.PathLike, out: str | os.PathLike) -> None:
    """Figure of a ``matmul`` (GFLOP/s vs size, per dtype) or ``collectives`` (bus bandwidth
    vs message size, per op and group size) CSV; the format follows ``out``'s suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    import seaborn as sns

    from scalestudy.record.io import atomic_path

    df = pd.read_csv(csv)
    fig, ax = plt.subplots(figsize=(6, 4))
    if df.empty:
        ax.text(0.5, 0.5, "no measurements", ha="center")
    elif kind == "matmul":
        df["size"] = (df["m"] * df["n"] * df["k"]) ** (1 / 3)
        df["GFLOP/s"] = df["flops_per_s"] / 1e9
        sns.lineplot(df, x="size", y="GFLOP/s", hue="dtype", marker="o", errorbar=("pi", 50), ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("matrix size (m·n·k)^(1/3)")
        ax.set_title(f"matmul throughput, {df['device_name'].iloc[0]}")
    elif kind == "collectives":
        df["GB/s (bus)"] = df["busbw_Bps"] / 1e9
        df["series"] = df["op"] + " p=" + df["group_size"].astype(str)
        sns.lineplot(df, x="bytes", y="GB/s (bus)", hue="series", marker="o", errorbar=("pi", 50), ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_title(f"collectives, {df['backend'].iloc[0]} on {df['device'].iloc[0]}")
    else:
        raise ValueError(f"plot kind {kind!r} is not supported; use matmul or collectives")
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def bench_memory_trainer(dp_modes=("ddp", "zero1", "fsdp"), nproc: int = 2,
                         timeout_s: float = 300) -> list[dict]:
    """The trainer's own peak (``summary.json`` ``peak_memory_bytes``, max RSS over ranks)
    under each ``dp_mode`` at dp = ``nproc``, minus that of a degenerate model run the same
    way (torch, gloo and the data: the baseline), against ``memory.estimate``. glibc is told
    to ``mmap`` allocations over 64 KiB so freed tensors leave the resident set."""
    import tempfile

    from scalestudy.perf import memory

    big = dict(vocab=8192, seq_len=64, layers=4, hidden=256, heads=4, name="mem")
    degenerate = dict(big, vocab=16, layers=1, hidden=8, heads=2, name="baseline")
    from scalestudy.run.launch import LOOPBACK_ENV, local_torchrun

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536",
           "OMP_NUM_THREADS": "1", **{var: "lo" for var in LOOPBACK_ENV}}
    peaks, points = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model, mode in [("baseline", degenerate, "ddp")] + [(m, big, m) for m in dp_modes]:
            p = identify(memory_point(model, 2, "none", dp=nproc, dp_mode=mode, steps=3,
                                      warmup_steps=1, lr=1e-3, device="cpu",
                                      timeout_s=timeout_s, study="memcheck",
                                      series=f"mem-{name}"))
            d = Path(tmp) / name
            d.mkdir()
            (d / "point.json").write_text(p.json_text())
            subprocess.run(["timeout", str(int(timeout_s)), *local_torchrun(nproc),
                            "-m", "scalestudy.train", str(d / "point.json"), str(d)],
                           env=env, capture_output=True, text=True, check=True)
            peaks[name] = json.loads((d / "summary.json").read_text())["peak_memory_bytes"]
            points[name] = p
    rows = []
    for mode in dp_modes:
        est = memory.estimate(points[mode])
        meas = peaks[mode] - peaks["baseline"]
        row = {"case": f"trainer-{mode}", "dp": nproc, **{f"est_{k}": est[k] for k in memory.COMPONENTS}}
        row.update(est_total_bytes=est["total_bytes"], measured_bytes=meas,
                   baseline_bytes=peaks["baseline"], rel_error=(est["total_bytes"] - meas) / meas)
        rows.append(row)
    return rows


# --- CLI ------------------------------------------------------------------------------------


def _square(sizes: list[int]) -> list[tuple[int, int, int]]:
    return [(s, s, s) for s in sizes]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalestudy.measure.microbench", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("matmul", help="matmul throughput by shape and dtype")
    m.add_argument("--out", required=True)
    m.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024], help="square m=n=k")
    m.add_argument("--shapes", nargs="*", default=[], help="extra shapes as MxNxK")
    m.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    m.add_argument("--device", default="auto")
    m.add_argument("--samples", type=int, default=5)
    m.add_argument("--budget-s", type=float, default=25.0)
    c = sub.add_parser("collectives", help="collective bandwidth/latency (run under torchrun)")
    c.add_argument("--out", required=True)
    c.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 1048576, 8388608], help="bytes")
    c.add_argument("--group-sizes", type=int, nargs="*", default=None)
    c.add_argument("--ops", nargs="+", default=list(OPS))
    c.add_argument("--samples", type=int, default=15)
    c.add_argument("--budget-s", type=float, default=25.0)
    o = sub.add_parser("overhead", help="framework overhead per micro-batch and per layer")
    o.add_argument("--out", required=True)
    v = sub.add_parser("validate", help="predicted vs measured step time, one CPU process")
    v.add_argument("--out", required=True)
    r = sub.add_parser("memory", help="memory estimate vs measured peak on CPU")
    r.add_argument("--out", required=True)
    r.add_argument("--trainer", action="store_true",
                   help="also the trainer under ddp/zero1/fsdp at dp=2 (torchrun, minutes)")
    pl = sub.add_parser("plot", help="figure of a matmul or collectives CSV")
    pl.add_argument("kind", choices=["matmul", "collectives"])
    pl.add_argument("csv")
    pl.add_argument("--out", required=True)
    ch = sub.add_parser("_memory_child")
    ch.add_argument("spec")
    a = ap.parse_args(argv)

    if a.cmd == "matmul":
        shapes = _square(a.sizes) + [tuple(int(x) for x in s.lower().split("x")) for s in a.shapes]
        rows = bench_matmul(shapes, a.dtypes, a.device, samples=a.samples, budget_s=a.budget_s)
        _write_rows(a.out, rows)
        best = max((r["flops_per_s"] for r in rows), default=0.0)
        print(f"matmul: {len(rows)} rows, best {best / 1e9:.1f} GFLOP/s -> {a.out}")
    elif a.cmd == "collectives":
        import torch
        import torch.distributed as dist

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
        try:
            rows = bench_collectives(a.sizes, a.group_sizes, tuple(a.ops), samples=a.samples,
                                     budget_s=a.budget_s)
            if dist.get_rank() == 0:
                _write_rows(a.out, rows)
                print(f"collectives: {len(rows)} rows -> {a.out}")
            dist.barrier()
        finally:
            dist.destroy_process_group()
    elif a.cmd == "overhead":
        rows = bench_overhead()
        _write_rows(a.out, rows)
        for s in summarize(rows, ["layout", "phase", "layers"]):
            print(f"{s['layout']} {s['phase']} layers={s['layers']}: {s['seconds'] * 1e3:.2f} ms")
        from scalestudy.perf.stepmodel import Measured

        fit = Measured.from_frames(overhead=rows, stat="best").overhead
        print("fit (fastest sample; a preset's overhead:):",
              ", ".join(f"{k}: {v * 1e3:.2f}e-3" for k, v in sorted(fit.items())))
    elif a.cmd == "validate":
        rows = bench_validate()
        _write_rows(a.out, rows)
        for r in rows:
            print(f"{r['case']}: predicted {r['predicted_s'] * 1e3:.1f} ms (compute "
                  f"{r['compute_s'] * 1e3:.1f} of which attention {r['attention_s'] * 1e3:.1f}, "
                  f"elementwise {r['elementwise_s'] * 1e3:.1f}, overhead {r['overhead_s'] * 1e3:.1f}, optimizer "
                  f"{r['optimizer_s'] * 1e3:.1f}), measured {r['measured_s'] * 1e3:.1f} ms, "
                  f"error {r['rel_error']:+.1%}")
    elif a.cmd == "memory":
        rows = bench_memory() + (bench_memory_trainer() if a.trainer else [])
        _write_rows(a.out, rows)
        for r in rows:
            print(f"{r['case']}: estimate {r['est_total_bytes'] / 2**20:.1f} MiB, measured "
                  f"{r['measured_bytes'] / 2**20:.1f} MiB, error {r['rel_error']:+.1%}")
    elif a.cmd == "plot":
        plot(a.kind, a.csv, a.out)
    elif a.cmd == "_memory_child":
        print(json.dumps(_memory_child(json.loads(a.spec))))
    return 0


def summarize(rows: list[dict], key: list[str], value: str = "seconds") -> list[dict]:
    """Median of ``value`` over samples, grouped by ``key`` columns."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in key), []).append(r[value])
    return [{**dict(zip(key, k)), value: statistics.median(v)} for k, v in groups.items()]


if __name__ == "__main__":
    sys.exit(main())
