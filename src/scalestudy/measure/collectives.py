"""Collectives' latency and bandwidth among this host's processes (``microbench
collectives``, under torchrun), and the pooling of a sweep's slices of that measurement into
one table."""

from __future__ import annotations

import time

from scalestudy.measure.common import seconds_per_call, sync_device, write_rows

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "send_recv": lambda p: 1.0,
}


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
    write_rows(out, pd.concat(frames, ignore_index=True).to_dict("records"))
    if log:
        write_text(log, f"{out}: {len(paths)} slices pooled\n")


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
                    sync_device(device)
                dist.barrier()
                # the repetition count is agreed on rank 0's probe so all members loop alike
                reps_t = torch.ones(1, device=device)
                if member:
                    sync_device(device)
                    t0 = time.perf_counter()
                    call()
                    sync_device(device)
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
