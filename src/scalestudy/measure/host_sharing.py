"""What sharing this host's cores costs the study's processes: the slowdown of ``k``
processes running the same work at once (``bench_core_sharing``) and the wait for the slowest
process at a synchronisation (``bench_sync_wait``)."""

from __future__ import annotations

import os
import statistics
import time

from scalestudy.config.parts import Model


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
    slowdown each process of a ``k``-process job sees (``host.core_sharing_slowdown``).
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
    ``scalestudy.perf.host.sync_wait_seconds`` reads ``wait_s``)."""
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
