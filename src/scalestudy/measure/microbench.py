"""Building-block measurements, runnable as DAG jobs; each writes one tidy CSV atomically.

    python -m scalestudy microbench matmul --out matmul.csv [--sizes 256 512] [--dtypes fp32 bf16]
    torchrun --nproc-per-node 4 -m scalestudy microbench collectives --out coll.csv \
        [--sizes 4096 1048576] [--group-sizes 2 4] [--ops all_reduce all_gather ...]
    python -m scalestudy microbench memory --out mem.csv      # estimate vs measured peak (CPU)

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

The measurements live in one module each under ``scalestudy.measure``: ``matmul``,
``collectives``, ``memory``, ``overhead``, ``blocks`` (the study's own model piece by piece),
``host_sharing`` (core sharing, the wait at a synchronisation), ``attention``, ``bandwidth``,
``validate`` and ``plots``; ``common`` holds what they share (timing, CSV output). This module
is their command line.
"""

from __future__ import annotations




def square_shapes(sizes: list[int]) -> list[tuple[int, int, int]]:
    return [(s, s, s) for s in sizes]
