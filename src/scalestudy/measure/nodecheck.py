"""The node check's probe: one task per node times a matrix product on its own node.

    srun --ntasks-per-node 1 python -m scalestudy nodecheck [--size 512]

Prints one JSON line, ``{"node": NAME, "flops_per_s": X}``: the node's Slurm name
(``SLURMD_NODENAME``, what ``srun --exclude`` takes; else the host name) and the median rate
of fp32 ``size``³ products on the device the task sees, a GPU when visible
(``scalestudy.measure.matmul.bench_matmul``; a few tenths of a second). Each node is timed
alone, so a slow node shows as itself, which a collective cannot (every rank of a collective
waits for the slowest). ``scalestudy.run.health`` runs it and judges the rows.
"""

from __future__ import annotations

import os
import socket
from statistics import median

from scalestudy.measure.matmul import bench_matmul


def probe(size: int = 512, samples: int = 3) -> dict:
    """This node's row: its name and the median FLOP/s of ``samples`` timed products."""
    rows = bench_matmul([(size, size, size)], ["fp32"], device=None, warmup=1,
                        samples=samples, min_time_s=0.05, budget_s=5.0)
    return {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "flops_per_s": median(r["flops_per_s"] for r in rows)}
