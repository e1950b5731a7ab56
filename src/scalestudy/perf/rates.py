"""Rates from measurements or presets: what a product, a collective or a memory-bound kernel
costs on a system.

``Measured`` holds what ``scalestudy.measure.microbench`` / ``calibrate`` timed on the machine
(matmul and attention rates, collective fits, copy bandwidth, framework overhead, the study's
own model piece by piece, the host's core sharing and synchronisation waits) and its readers;
where it has no figure the system's declared one (``hardware.yaml``, ``HardwareSpec``) is used.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.vocab import DType
from scalestudy.perf.hardware import HardwareSpec, Link

#: Bytes of an activation element: 2 in 16-bit training, 4 in fp32 (keyed by "16-bit?").
ACT_BYTES = {True: 2, False: 4}


# --- measurements ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """Building blocks measured by ``scalestudy.measure.microbench``.

    ``matmul``: ``{dtype: [(m, n, k, flops_per_s), ...]}`` (medians over samples);
    ``collectives``: ``{(op, group_size): (alpha_s, beta_alg_Bps)}`` fitted by least squares
    ``t = α + bytes/β`` over message sizes; ``blocks``: ``{block_key: {name: seconds}}``, the
    study's own model timed piece by piece (``blocks.bench_blocks``: ``fwd_bwd_s`` a
    whole micro-batch forward + backward, ``layer_s`` one layer's, ``embedding_s``,
    ``head_s`` (final norm, head, loss), ``optimizer_s`` (all parameters),
    ``optimizer_layer_s`` (one layer's), ``step_s`` (a one-micro-batch step as the trainer
    runs it));
    ``core_sharing``: ``{procs: factor}``, the measured slowdown of each of ``procs``
    processes sharing the host's cores (``host_sharing.bench_core_sharing``); ``sync_wait``:
    ``{procs: [(grain_s, wait_s), ...]}``, the wait for the slowest of ``procs`` processes at
    one synchronisation after ``grain_s`` of compute (``host_sharing.bench_sync_wait``)."""

    matmul: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    mem_bw: float | None = None
    blocks: dict = field(default_factory=dict)
    core_sharing: dict = field(default_factory=dict)
    sync_wait: dict = field(default_factory=dict)

    def block(self, point: Point) -> dict | None:
        """The measured blocks of ``point``'s model and micro-batch in its layout
        (``block_layout``), or None."""
        return self.blocks.get(block_key(point.model, point.seq_len, point.micro_batch,
                                         block_layout(point)))

    def attention_rate(self, dtype: str, s: float, head_dim: float) -> float | None:
        """Measured fused-attention FLOP/s (Megatron count) at the nearest (seq, head_dim)."""
        rows = self.attention.get(dtype)
        if not rows:
            return None
        ls, lh = math.log(max(s, 1.0)), math.log(max(head_dim, 1.0))
        return min(rows, key=lambda r: (math.log(r[0]) - ls) ** 2 + (math.log(r[1]) - lh) ** 2)[2]

    @property
    def matmul_peak(self) -> dict:
        return {dt: max(r[3] for r in rows) for dt, rows in self.matmul.items()}

    def matmul_rate(self, dtype: str, m: float, n: float, k: float) -> float | None:
        """Measured FLOP/s at the measured shape nearest (in log size) to ``m·n·k``."""
        rows = self.matmul.get(dtype)
        if not rows:
            return None
        lm, ln, lk = (math.log(max(x, 1.0)) for x in (m, n, k))
        return min(rows, key=lambda r: (math.log(r[0]) - lm) ** 2 + (math.log(r[1]) - ln) ** 2
                   + (math.log(r[2]) - lk) ** 2)[3]

    def collective_time(self, op: str, nbytes: float, group: int) -> float | None:
        """Seconds for ``op`` on ``nbytes`` among ``group`` ranks, from the fit at that group
        size, else from the nearest measured group size rescaled by the ring bus factor."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        fits = {p: v for (o, p), v in self.collectives.items() if o == op}
        if not fits:
            return None
        if group in fits:
            a, b = fits[group]
            return a + nbytes / b
        p0 = min(fits, key=lambda p: abs(p - group))
        a, b = fits[p0]
        f = _bus_factor(op, group) / _bus_factor(op, p0)
        return a + f * nbytes / b

    @classmethod
    def from_calibration(cls, path: str | Path) -> "Measured":
        """What a study measured during its run (``calibration.json`` of
        ``scalestudy.measure.calibrate``): the matmul ceiling (dtype, m, n, k, flops_per_s),
        its own products' rates (``shapes``) and, on a CPU, the framework overhead
        (``overhead``: ``microbench overhead`` samples, fitted from the fastest sample like
        the ``cpu-local`` preset's) and the copy bandwidth (``bandwidth``, fastest sample)."""
        import json

        with open(path) as f:
            c = json.load(f)
        rows = [(int(c["m"]), int(c["n"]), int(c["k"]), float(c["flops_per_s"]))]
        rows += [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops_per_s"]))
                 for r in c.get("shapes") or []]
        host = cls.from_frames(overhead=c.get("overhead") or None,
                               bandwidth=c.get("bandwidth") or None, stat="best")
        own = cls.from_frames(blocks=c.get("blocks") or None,
                              core_sharing=c.get("core_sharing") or None)
        return cls(matmul={c["dtype"]: rows}, overhead=host.overhead, mem_bw=host.mem_bw,
                   blocks=own.blocks, core_sharing=own.core_sharing,
                   sync_wait=sync_wait_from_rows(c.get("sync_wait") or []))

    @classmethod
    def from_csv(cls, matmul_csv: str | None = None, collectives_csv: str | None = None,
                 overhead_csv: str | None = None) -> "Measured":
        import pandas as pd

        return cls.from_frames(*(pd.read_csv(p) if p else None
                                 for p in (matmul_csv, collectives_csv, overhead_csv)))

    @classmethod
    def from_frames(cls, matmul=None, collectives=None, overhead=None, attention=None,
                    bandwidth=None, stat: str = "median", blocks=None,
                    core_sharing=None) -> "Measured":
        """From microbench tables (DataFrames or lists of row dicts; ``None`` to skip).
        ``stat``: ``median`` over samples, or ``best`` (fastest sample: on a shared host
        contention only adds time, so the best sample estimates the uncontended rate).
        ``blocks`` and ``core_sharing`` always take the median: the study's steps are
        reported as medians under the host's load, and these blocks stand for those steps
        (``blocks_from_rows``, ``core_sharing_from_rows``)."""
        if stat not in ("median", "best"):
            raise ValueError(f"stat={stat!r} is not supported; use median or best")
        fast = "max" if stat == "best" else "median"  # for rates
        slow = "min" if stat == "best" else "median"  # for times
        import numpy as np
        import pandas as pd

        mm, coll, ovh = {}, {}, {}
        matmul_csv, collectives_csv = matmul, collectives
        if matmul_csv is not None:
            df = pd.DataFrame(matmul_csv)
            g = df.groupby(["dtype", "m", "n", "k"], as_index=False)["flops_per_s"].agg(fast)
            for r in g.itertuples():
                mm.setdefault(r.dtype, []).append((r.m, r.n, r.k, r.flops_per_s))
        if collectives_csv is not None:
            df = pd.DataFrame(collectives_csv)
            g = df.groupby(["op", "group_size", "bytes"], as_index=False)["seconds"].agg(slow)
            for (op, p), sub in g.groupby(["op", "group_size"]):
                x, y = sub["bytes"].to_numpy(float), sub["seconds"].to_numpy(float)
                if len(x) >= 2 and np.ptp(x) > 0:
                    slope, alpha = np.polyfit(x, y, 1)
                else:
                    slope, alpha = y[0] / x[0], 0.0
                slope = max(slope, 1e-15)
                coll[(op, int(p))] = (max(alpha, 0.0), 1.0 / slope)
        if overhead is not None:
            df = pd.DataFrame(overhead)
            if "layout" not in df:
                df["layout"] = "plain"
            for (layout, phase), sub in df.groupby(["layout", "phase"]):
                g = sub.groupby("layers")["seconds"].agg(slow)
                if len(g) >= 2:
                    slope, fixed = np.polyfit(g.index.to_numpy(float), g.to_numpy(float), 1)
                else:
                    slope, fixed = 0.0, float(g.iloc[0])
                pre = "" if layout == "plain" else f"{layout}_"
                ovh[f"{pre}{phase}_fixed_s"] = max(float(fixed), 0.0)
                ovh[f"{pre}{phase}_per_layer_s"] = max(float(slope), 0.0)
        att = {}
        if attention is not None:
            df = pd.DataFrame(attention)
            g = df.groupby(["dtype", "seq", "head_dim"], as_index=False)["flops_per_s"].agg(fast)
            for r in g.itertuples():
                att.setdefault(r.dtype, []).append((r.seq, r.head_dim, r.flops_per_s))
        bw = None
        if bandwidth is not None:
            bw = float(pd.DataFrame(bandwidth)["bytes_per_s"].agg(fast))
        return cls(matmul=mm, collectives=coll, overhead=ovh, attention=att, mem_bw=bw,
                   blocks=blocks_from_rows(blocks) if blocks is not None else {},
                   core_sharing=(core_sharing_from_rows(core_sharing)
                                 if core_sharing is not None else {}))


def block_layout(point: Point) -> str:
    """The layout a calibration times ``point``'s blocks in: ``tp<d>`` under ``d``-way tensor
    parallelism (DTensor, rank 0 of a ``d``-rank mesh on torch's ``fake`` process group: one
    rank's share of the arithmetic and every exchange's dispatch, no communication), else
    ``plain``."""
    return f"tp{point.tp}" if point.tp > 1 else "plain"


def block_layout_tp(layout: str) -> int:
    """The tensor-parallel degree of a block layout (``block_layout``): 1 for ``plain``.
    Raises ``ValueError`` for another name."""
    m = re.fullmatch(r"tp([1-9][0-9]*)", layout)
    if layout != "plain" and not (m and int(m[1]) > 1):
        raise ValueError(f"block layout {layout!r} is not supported; use plain or tp<degree> "
                         "(tp2, tp4, ...)")
    return int(m[1]) if m else 1


def block_key(model: Model, seq_len: int, micro_batch: int, layout: str) -> str:
    """The name of a measured block set: model name, shape, micro-batch and layout."""
    return (f"{model.name}:l{model.layers}h{model.hidden}a{model.heads}v{model.vocab}"
            f"s{seq_len}:b{micro_batch}:{layout}")


#: Blocks read as the median over rounds of their sample less the same round's ``fwd_bwd``
#: sample: ``{name in the blocks: block timed}``.
PAIRED_BLOCKS = {"step_optimizer_s": "step", "ddp_micro_batch_s": "ddp_fwd_bwd",
                 "ddp_sync_s": "ddp_sync_fwd_bwd"}


def blocks_from_rows(rows) -> dict:
    """``{key: {block: seconds}}`` from ``blocks.bench_blocks`` rows: the median over
    samples of each block (``fwd_bwd``, ``layer``, ``embedding``, ``head``, ``optimizer``,
    ``optimizer_layer``, ``step``, ``ddp_fwd_bwd``, ``ddp_sync_fwd_bwd``), and the paired ones
    (``PAIRED_BLOCKS``): the median over rounds of a block's sample less the ``fwd_bwd`` sample
    of the same round (``sample``), at least 0: ``step_optimizer_s`` the optimizer as a step
    runs it (``in_step_optimizer``), ``ddp_micro_batch_s`` / ``ddp_sync_s``
    ``DistributedDataParallel``'s own cost of a micro-batch without / with the gradient sync
    (``ddp_wrapper_seconds``). A paired difference, so a drift of the host's speed between
    rounds cancels instead of adding the noise of two medians."""
    import statistics as st

    by: dict = {}
    for r in (rows.to_dict("records") if hasattr(rows, "to_dict") else rows):
        by.setdefault(r["key"], {}).setdefault(r["block"], []).append(
            (r.get("sample"), float(r["seconds"])))
    out = {}
    for key, blocks in by.items():
        if "fwd_bwd" not in blocks:
            continue
        out[key] = {f"{b}_s": st.median(t for _, t in v) for b, v in blocks.items()}
        mb = {i: t for i, t in blocks["fwd_bwd"] if i is not None}
        for name, block in PAIRED_BLOCKS.items():
            paired = [t - mb[i] for i, t in blocks.get(block, []) if i in mb]
            if paired:
                out[key][name] = max(st.median(paired), 0.0)
    return out


def sync_wait_from_rows(rows) -> dict:
    """``{procs: [(grain_s, wait_s), ...]}`` (by grain) from ``host_sharing.bench_sync_wait``
    rows: the median wait per process count and grain."""
    import statistics as st

    by: dict = {}
    for r in rows:
        by.setdefault(int(r["procs"]), {}).setdefault(float(r["grain_s"]), []).append(
            float(r["wait_s"]))
    return {k: sorted((g, st.median(v)) for g, v in waits.items()) for k, waits in by.items()}


def core_sharing_from_rows(rows) -> dict:
    """``{procs: factor}`` from ``host_sharing.bench_core_sharing`` rows: the median factor per
    process count (1 process: 1 by construction), at least 1: processes sharing the cores
    cannot each run faster than one alone, so a median below 1 is the host's drift between
    the timings, not a speed-up."""
    import statistics as st

    by: dict = {}
    for r in (rows.to_dict("records") if hasattr(rows, "to_dict") else rows):
        by.setdefault(int(r["procs"]), []).append(float(r["factor"]))
    return {k: max(1.0, st.median(v)) for k, v in sorted(by.items())}


# --- rates ----------------------------------------------------------------------------------


def _bus_factor(op: str, p: int) -> float:
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0


def collective_time(op: str, nbytes: float, group: int, link: Link,
                    measured: Measured | None = None, adjacent: bool = True,
                    nodes: int = 1) -> float:
    """Seconds for one ring collective of a ``nbytes`` buffer among ``group`` ranks on
    ``nodes`` nodes: ``α + factor(p) · n / β`` (factor: all-reduce ``2(p-1)/p``, all-gather /
    reduce-scatter ``(p-1)/p``, send/recv 1; Thakur et al. 2005 ring algorithms, the
    bus-bandwidth convention of nccl-tests), or the measured fit when ``measured`` has one.
    ``β`` is the link's per-device bandwidth (``hardware.yaml``); ``α`` the link's
    ``call_latency``: on a GPU system the collective library's ring latency, which grows with
    the ring's steps inside and between nodes (NCCL's tuning model, Simple protocol), else the
    link's latency per call."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    if measured is not None:
        t = measured.collective_time(op, nbytes, group)
        if t is not None:
            return t
    return (link.call_latency(op, group, nodes)
            + _bus_factor(op, group) * nbytes / link.bw(group, adjacent))


def tile_wave_efficiency(M: float, N: float, tile: tuple | None, units: int | None,
                         batch: float = 1) -> float:
    """Useful fraction of the work a GEMM's output tiles schedule (dimensionless, ≤ 1).

    Tile quantisation: the ``M × N`` output is covered by ``⌈M/Tm⌉·⌈N/Tn⌉`` tiles of
    ``Tm × Tn``, so ``M·N / (⌈M/Tm⌉Tm·⌈N/Tn⌉Tn)`` of the tiles' work is useful. Wave
    quantisation: ``T`` tiles run in ``⌈T/units⌉`` waves over the ``units`` SMs / CUs, so
    ``T / (⌈T/units⌉·units)`` of the last wave's slots are busy (NVIDIA/cutlass issue #335:
    "You need ceil(210/108)=2 waves"; NVIDIA Matrix Multiplication Background guide §3.1-3.2).
    A batched product (``batch`` independent products in one launch, as cuBLAS's strided
    batched GEMM runs the attention's per-head products) schedules ``batch · T`` tiles in its
    waves. 1 when the system declares no tile (a CPU host)."""
    if not tile:
        return 1.0
    tm, tn = tile
    gm, gn = math.ceil(M / tm), math.ceil(N / tn)
    q = (M * N) / (gm * tm * gn * tn)
    if units:
        tiles = gm * gn * max(1, math.ceil(batch))
        q *= tiles / (math.ceil(tiles / units) * units)
    return q


def gemm_efficiency(M: float, N: float, K: float, hw: HardwareSpec, batch: float = 1) -> float:
    """Fraction of the dtype's peak that one ``M×K · K×N`` product (or a batch of ``batch``
    of them in one launch) reaches on ``hw``: the sustained GEMM ceiling
    ``hw.matmul_efficiency · hw.sustained`` (the device's best-shape ceiling × the fraction a
    training run sustains, ``HardwareSpec``) times the tile/wave quantisation of its output
    (``tile_wave_efficiency``), of which the fraction ``hw.gemm_quantisation`` applies (1: the
    declared tile always; 0: libraries find a tile without loss). ``K`` enters through the
    roofline of ``gemm_seconds``."""
    q = tile_wave_efficiency(M, N, hw.gemm_tile, hw.multiprocessors, batch)
    return (hw.matmul_efficiency * hw.sustained * hw.power_factor
            * (1.0 - hw.gemm_quantisation * (1.0 - q)))


def gemm_seconds(M: float, N: float, K: float, count: float, dtype: str, hw: HardwareSpec,
                 batched: bool = False) -> float:
    """Seconds for ``count`` products ``M×K · K×N`` at the declared rate: ``2·M·N·K / (peak ·
    gemm_efficiency)``, or, when moving its operands and output (``(M·K + K·N + M·N)`` elements
    at 2 bytes, 4 in fp32) at ``mem_bw · mem_bw_efficiency`` takes longer, that (the
    roofline; only where the system declares a GEMM tile, i.e. a GPU). ``batched``: the
    ``count`` products are one batched launch, quantised together."""
    eff = gemm_efficiency(M, N, K, hw, count if batched else 1)
    t = 2.0 * M * N * K / (hw.peak(dtype) * eff)
    if hw.gemm_tile:
        eb = 4 if dtype == DType.FP32 else 2
        t = max(t, eb * (M * K + K * N + M * N) / (hw.mem_bw * hw.mem_bw_efficiency))
    return count * t


def product_seconds(M: float, N: float, K: float, count: float, dtype: str, hw: HardwareSpec,
                    measured: Measured | None = None,
                    batched: bool = False) -> tuple[float, float, bool]:
    """``(forward_s, backward_s, measured?)`` of ``count`` products ``M×K · K×N`` in training.

    Measured: ``2·M·N·K·count`` FLOPs at the rate measured for the nearest shape
    (``Measured.matmul_rate``; a study calibrates its forward shapes), backward = 2 ×
    forward. Declared: the forward shape and the two backward products, data gradient
    ``M×N · N×K`` and weight gradient ``K×M · M×N``, each at ``gemm_seconds``."""
    r = measured.matmul_rate(dtype, M, N, K) if measured is not None else None
    if r:
        fwd = 2.0 * M * N * K * count / r
        return fwd, 2.0 * fwd, True
    fwd = gemm_seconds(M, N, K, count, dtype, hw, batched)
    bwd = (gemm_seconds(M, K, N, count, dtype, hw, batched)
           + gemm_seconds(K, N, M, count, dtype, hw, batched))
    return fwd, bwd, False


def elementwise_seconds(nbytes: float, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds to move ``nbytes`` at the measured copy bandwidth, else at ``mem_bw ·
    mem_bw_efficiency`` of ``hw`` (datasheet HBM bandwidth times the stated fraction)."""
    if measured is not None and measured.mem_bw:
        return nbytes / measured.mem_bw
    return nbytes / (hw.mem_bw * hw.mem_bw_efficiency)
