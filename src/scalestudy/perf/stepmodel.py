"""Predicted step time of a training point, as a sum of named terms.

``predict_step_time(point, hw, measured=None, dp_overlap=None)`` returns a ``StepBreakdown``:
seconds per optimizer step of the bottleneck pipeline stage, split into the terms below. Each
term is a pure function of this module with its units and source in its docstring; every
hardware or framework figure it uses comes from ``data/hardware.yaml`` (``hw``), where each
uncertain one carries its stated range and source, or from measurements (``measured``,
``scalestudy.measure.microbench`` / ``calibrate``). Nothing is fitted to a published result.

Notation: micro-batch ``b`` sequences of ``s`` tokens, hidden ``h``, ``a`` heads, MLP width
``f``, vocabulary ``V``, ``l`` layers on ``pp`` stages (``v`` virtual stages each), ``tp`` /
``dp`` ranks, ``m`` micro-batches per pipeline and step.

Terms (seconds per step; ``docs/performance-model.md`` has the full table with sources):

- ``gemm_s`` — dense products (q/k/v/o projections, MLP, output head): forward, the two
  backward products (data and weight gradients) and the recomputed forward, each at the
  device's GEMM ceiling times its tile/wave quantisation for that shape
  (``gemm_efficiency``), or at the rate measured for the nearest shape.
- ``attention_s`` — the attention core: a fused kernel at its published rate
  (``attention_seconds``, FlashAttention-2 FLOP count: causal half, backward 2.5 ×), or the
  ``Q Kᵀ`` / ``A V`` products at GEMM rates.
- ``elementwise_s`` — memory-bound kernels (norms, residual adds, activation, loss) at the
  device's bandwidth (``elementwise_bytes`` / ``elementwise_seconds``).
- ``grad_accum_s`` — adding each micro-batch's gradients to the step's, memory-bound, as the
  framework does it (``grad_accumulation_seconds``: PyTorch's in-place ``AccumulateGrad``,
  DeepSpeed's BF16_Optimizer fp32 copy, or fused into the weight-gradient product).
- ``overhead_s`` — framework overhead per micro-batch (measured on a CPU host; 0 on GPUs).
- ``tp_comm_s`` — exposed tensor-parallel collectives (``tp_collective_seconds``), minus the
  framework's declared overlap.
- ``pp_p2p_s`` — exposed pipeline transfers (``p2p_seconds``), as the framework schedules
  them (blocking or batched, partitioned over TP, overlapped with interleaving).
- ``pp_bubble_s`` — the pipeline fill and drain (``pipeline_seconds``): the other stages'
  micro-batch slots, divided by ``v``.
- ``dp_comm_exposed_s`` — the data-parallel gradient traffic left after the framework's
  overlap (``dp_comm_seconds`` / ``dp_exposed_seconds``), and before it the tied embedding's
  gradient all-reduce between the first and the last pipeline stage (``tied_grad_seconds``).
- ``optimizer_s`` — AdamW over the optimizer shard at memory bandwidth, plus clipping
  (``optimizer_seconds``).

On a CPU host that measured the study's own model piece by piece (``Measured.blocks``, the
calibrate job) each stage's micro-batch and optimizer are composed from those blocks
(``composed_stage_seconds``, ``composed_optimizer_seconds``; under TP timed on one rank of the
point's mesh, ``block_layout``): the
arithmetic terms stay as modelled and the measured rest is ``overhead_s``
(``split_measured_slot``). On a CPU host the computing phases are multiplied by the slowdown of
the point's processes sharing the cores (``core_sharing_slowdown``: measured where the host's
sharing was, ``Measured.core_sharing``, else ``procs / compute_units`` when they outnumber the
cores), and each collective by the sharing its time does not already carry
(``collective_sharing``: a measured one ran with only its group's processes busy); the
breakdown says whether the point is ``oversubscribed``. Not modelled: kernel-launch gaps on GPUs, load
imbalance between stages other than the embedding and head, network contention beyond the
per-device NIC share, stragglers, the operating system's scheduling beyond the core-sharing
slowdown. Where these matter the model under-predicts.

``predict_range`` evaluates a point under every scenario of ``hw.scenarios()`` (the stated
ranges of its assumptions) and returns the central breakdown with the envelope.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from scalestudy.config.point import DPWrapper, Model, Point
from scalestudy.config.vocab import AttentionKernel, Checkpointing, DPMode, DType
from scalestudy.perf import flops, kernels, memory, partition
from scalestudy.perf.hardware import Framework, HardwareSpec, Link, presets

ACT_BYTES = {True: 2, False: 4}
#: AdamW with fp32 state: read weight, gradient, two moments (and the master copy), write them
#: back (bytes per parameter of the optimizer shard).
OPT_BYTES_TOUCHED = 28
#: FlashAttention-2's FLOP convention (Dao, arXiv:2307.08691 §4.1): a causal mask halves the
#: forward FLOPs ("With causal mask, we divide this number by 2") and the backward costs 2.5 ×
#: the forward ("backward pass FLOPs ... forward pass FLOPs by 2.5").
FA_CAUSAL_FRACTION = 0.5
FA_BACKWARD_FACTOR = 2.5


def spec_from_microbench(matmul_csv: str, collectives_csv: str | None = None,
                         name: str = "measured", devices_per_node: int = 1,
                         memory_bytes: float = 0.0, mem_bw: float = 5e9) -> HardwareSpec:
    """A spec whose peaks are the measured matmul ceilings (efficiency 1) and whose
    intra-node link is fitted to the measured all-reduce (α, bus bandwidth)."""
    m = Measured.from_csv(matmul_csv, collectives_csv)
    intra = Link(1e9, 0.0)
    if m.collectives:
        (_, p), (alpha, beta) = max(
            ((k, v) for k, v in m.collectives.items() if k[0] == "all_reduce"),
            key=lambda kv: kv[0][1], default=next(iter(m.collectives.items())),
        )
        intra = Link(beta * 2 * (p - 1) / p, alpha)
    return HardwareSpec(name=name, device=name, devices_per_node=devices_per_node,
                        peak_flops=dict(m.matmul_peak), memory_bytes=memory_bytes, mem_bw=mem_bw,
                        matmul_efficiency=1.0, intra=intra, inter=None, source="microbench")


# --- measurements ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """Building blocks measured by ``scalestudy.measure.microbench``.

    ``matmul``: ``{dtype: [(m, n, k, flops_per_s), ...]}`` (medians over samples);
    ``collectives``: ``{(op, group_size): (alpha_s, beta_alg_Bps)}`` fitted by least squares
    ``t = α + bytes/β`` over message sizes; ``blocks``: ``{block_key: {name: seconds}}``, the
    study's own model timed piece by piece (``microbench.bench_blocks``: ``fwd_bwd_s`` a
    whole micro-batch forward + backward, ``layer_s`` one layer's, ``embedding_s``,
    ``head_s`` (final norm, head, loss), ``optimizer_s`` (all parameters),
    ``optimizer_layer_s`` (one layer's), ``step_s`` (a one-micro-batch step as the trainer
    runs it));
    ``core_sharing``: ``{procs: factor}``, the measured slowdown of each of ``procs``
    processes sharing the host's cores (``microbench.bench_core_sharing``); ``sync_wait``:
    ``{procs: [(grain_s, wait_s), ...]}``, the wait for the slowest of ``procs`` processes at
    one synchronisation after ``grain_s`` of compute (``microbench.bench_sync_wait``)."""

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
    """``{key: {block: seconds}}`` from ``microbench.bench_blocks`` rows: the median over
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
    """``{procs: [(grain_s, wait_s), ...]}`` (by grain) from ``microbench.bench_sync_wait``
    rows: the median wait per process count and grain."""
    import statistics as st

    by: dict = {}
    for r in rows:
        by.setdefault(int(r["procs"]), {}).setdefault(float(r["grain_s"]), []).append(
            float(r["wait_s"]))
    return {k: sorted((g, st.median(v)) for g, v in waits.items()) for k, waits in by.items()}


def core_sharing_from_rows(rows) -> dict:
    """``{procs: factor}`` from ``microbench.bench_core_sharing`` rows: the median factor per
    process count (1 process: 1 by construction), at least 1: processes sharing the cores
    cannot each run faster than one alone, so a median below 1 is the host's drift between
    the timings, not a speed-up."""
    import statistics as st

    by: dict = {}
    for r in (rows.to_dict("records") if hasattr(rows, "to_dict") else rows):
        by.setdefault(int(r["procs"]), []).append(float(r["factor"]))
    return {k: max(1.0, st.median(v)) for k, v in sorted(by.items())}


def _bus_factor(op: str, p: int) -> float:
    if op == "all_reduce":
        return 2 * (p - 1) / p
    if op in ("all_gather", "reduce_scatter"):
        return (p - 1) / p
    return 1.0


def collective_time(op: str, nbytes: float, group: int, link: Link,
                    measured: Measured | None = None, adjacent: bool = True) -> float:
    """Seconds for one ring collective of a ``nbytes`` buffer among ``group`` ranks:
    ``α + factor(p) · n / β`` (factor: all-reduce ``2(p-1)/p``, all-gather / reduce-scatter
    ``(p-1)/p``, send/recv 1; Thakur et al. 2005 ring algorithms, the bus-bandwidth convention
    of nccl-tests), or the measured fit when ``measured`` has one. ``β`` is the link's
    per-device bandwidth (``hardware.yaml``), ``α`` its latency."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    if measured is not None:
        t = measured.collective_time(op, nbytes, group)
        if t is not None:
            return t
    return link.latency + _bus_factor(op, group) * nbytes / link.bw(group, adjacent)


# --- compute terms --------------------------------------------------------------------------


def layer_gemms(model: Model, s: int, b: int, tp: int = 1, attention_only: bool = False,
                fused_qkv: bool = False) -> list:
    """The forward matrix products of one layer on one TP rank as ``(M, N, K, count)``
    (``M×K`` times ``K×N``), as Megatron-style tensor parallelism splits them: q, k, v and
    the MLP's up (and gate) products column-parallel (``N`` divided by ``tp``), the attention
    output and MLP down products row-parallel (``K`` divided by ``tp``), and the attention
    core's ``Q Kᵀ`` and ``A V`` (``s × s × head_dim``, ``2·b·a/tp`` of them). ``fused_qkv``:
    q, k, v (and SwiGLU's gate and up) as one product (Megatron) instead of separate ones
    (``scalestudy.models.gpt``). FLOPs: ``2·M·N·K·count`` summed = ``flops.layer_forward_flops``."""
    h, f, a, kv = model.hidden, model.ffn, model.heads, model.kv_dim
    attn = [(s, s, model.head_dim, 2 * b * a / tp)]
    if attention_only:
        return attn
    bs = b * s
    up = model.mlp_matrices - 1  # GELU: 1 (up); SwiGLU: 2 (gate, up)
    # q is h wide, k and v kv_dim wide each (grouped-query attention: kv_heads · head_dim)
    qkv = ([(bs, (h + 2 * kv) / tp, h, 1)] if fused_qkv else
           [(bs, h / tp, h, 1), (bs, kv / tp, h, 2)])
    mlp_up = [(bs, up * f / tp, h, 1)] if (fused_qkv and up > 1) else [(bs, f / tp, h, up)]
    return qkv + [(bs, h, h / tp, 1)] + mlp_up + [(bs, h, f / tp, 1)] + attn


def head_gemm(model: Model, s: int, b: int, tp: int = 1) -> tuple:
    """The output head's forward product ``(b·s, V/tp, h, 1)`` (vocabulary-parallel)."""
    return (b * s, model.vocab / tp, model.hidden, 1)


def gemm_shapes(points) -> list[tuple[int, int, int]]:
    """The distinct forward matrix products ``(M, N, K)`` of the feasible points (per TP rank:
    projections, MLP, attention, head), for measuring them where the study runs
    (``scalestudy.measure.calibrate --shapes``)."""
    shapes = set()
    for p in points:
        if not p.feasible:
            continue
        model, tp, s, b = p.model, p.tp, p.seq_len, p.micro_batch
        for M, N, K, _ in layer_gemms(model, s, b, tp) + [head_gemm(model, s, b, tp)]:
            shapes.add((int(M), int(N), int(K)))
    return sorted(shapes)


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


def attention_seconds(model: Model, s: int, b: int, tp: int, dtype: str, hw: HardwareSpec,
                      measured: Measured | None = None) -> tuple[float, float, bool]:
    """``(forward_s, backward_s, measured?)`` of one layer's attention core on one TP rank.

    Measured: a fused-attention rate (``Measured.attention_rate``, Megatron's count
    ``4·s²·h/tp`` per sequence), else the ``Q Kᵀ`` / ``A V`` products at the nearest measured
    matmul rate; backward = 2 × forward. Declared, fused kernel (``model.attention == fused``
    and the system declares ``attention.efficiency``): FlashAttention-2's count, the causal
    forward ``0.5 · 4·b·s²·h/tp`` and the backward ``2.5 ×`` that (Dao, arXiv:2307.08691
    §4.1), at ``attention_efficiency × peak``. Otherwise the products at ``gemm_seconds``."""
    head = model.head_dim
    if measured is not None:
        r = measured.attention_rate(dtype, s, head)
        if r:
            fwd = 4.0 * b * s * s * model.hidden / tp / r
            return fwd, 2.0 * fwd, True
    (M, N, K, count), = layer_gemms(model, s, b, tp, attention_only=True)
    r = measured.matmul_rate(dtype, M, N, K) if measured is not None else None
    if r:
        fwd = 2.0 * M * N * K * count / r
        return fwd, 2.0 * fwd, True
    if model.attention == AttentionKernel.FUSED and hw.attention_efficiency:
        fwd_flops = FA_CAUSAL_FRACTION * 4.0 * b * s * s * model.hidden / tp
        rate = hw.attention_efficiency * hw.sustained * hw.power_factor * hw.peak(dtype)
        return fwd_flops / rate, FA_BACKWARD_FACTOR * fwd_flops / rate, False
    # math attention: the scores' products are batched over heads and sequences (one
    # strided-batched launch each), plus the softmax over the s x s scores (memory-bound)
    fwd, bwd, _ = product_seconds(M, N, K, count, dtype, hw, batched=True)
    heads = count / 2  # (b·a/tp) score matrices of s x s
    ab = ACT_BYTES[DType(dtype) != DType.FP32]
    e_fwd, e_bwd = kernels.softmax_elements(hw.framework.fusion, hw.framework.dropout)
    soft_fwd = elementwise_seconds(e_fwd * heads * s * s * ab, hw, measured)
    soft_bwd = elementwise_seconds(e_bwd * heads * s * s * ab, hw, measured)
    return fwd + soft_fwd, bwd + soft_bwd, False


def elementwise_bytes(model: Model, s: int, b: int, act_bytes: int, tp: int = 1,
                      sp: bool = False, fusion: str = "eager", dropout: bool = False) -> float:
    """Memory traffic of one layer's memory-bound kernels, forward + backward, on one TP rank
    (bytes): the inventory of ``scalestudy.perf.kernels`` for the model's architecture and the
    framework's fusion level (GPT: two LayerNorms, two residual adds, the attention output
    relayout and GELU, ``12h + 2f`` elements per token forward; Llama adds RMSNorm's fp32
    steps, rotary embeddings and SwiGLU), the backward twice the forward."""
    return kernels.layer_traffic(model, fusion, tp, sp, dropout) * s * b * act_bytes


def loss_bytes(s: int, b: int, vocab: int, tp: int = 1, fusion: str = "fused",
               act_bytes: int = 4) -> float:
    """Memory traffic of the log-softmax / cross-entropy over ``b·s·V/tp`` logits and its
    backward (bytes; ``kernels.loss_bytes_per_logit``)."""
    return kernels.loss_bytes_per_logit(fusion, act_bytes) * b * s * vocab / tp


def elementwise_seconds(nbytes: float, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds to move ``nbytes`` at the measured copy bandwidth, else at ``mem_bw ·
    mem_bw_efficiency`` of ``hw`` (datasheet HBM bandwidth times the stated fraction)."""
    if measured is not None and measured.mem_bw:
        return nbytes / measured.mem_bw
    return nbytes / (hw.mem_bw * hw.mem_bw_efficiency)


# --- communication terms --------------------------------------------------------------------


def tp_collective_seconds(act_bytes: float, tp: int, hw: HardwareSpec, sp: bool = False,
                          measured: Measured | None = None) -> float:
    """Seconds of one Megatron TP exchange of a ``b·s·h`` activation (``act_bytes``) on the
    intra-node link: an all-reduce, or with sequence parallelism an all-gather plus a
    reduce-scatter of the same volume (Korthikanti et al. 2022). A layer does 2 in the forward
    and 2 in the backward pass (Shoeybi et al. 2019, Fig. 4), 2 more when it is recomputed."""
    if tp <= 1:
        return 0.0
    if sp:
        return (collective_time("all_gather", act_bytes, tp, hw.intra, measured)
                + collective_time("reduce_scatter", act_bytes, tp, hw.intra, measured))
    return collective_time("all_reduce", act_bytes, tp, hw.intra, measured)


def cp_exchange_seconds(model: Model, s: int, b: int, tp: int, cp: int, act_bytes: int,
                        hw: HardwareSpec, measured: Measured | None = None,
                        devices_per_node: int | None = None) -> float:
    """Seconds of one layer's context-parallel K/V exchange for one micro-batch (forward +
    backward), exposed: the cp ranks all-gather K and V (``2·b·s·kv_dim/tp`` elements in all)
    before the forward attention, again before the backward one, and reduce-scatter their
    gradients (Dubey et al. 2024 §3.3.2: Llama 3 all-gathers K and V, "exposed in the critical
    path"; torch's ``context_parallel`` rotates the same volume). On the intra-node link while
    ``cp·tp`` ranks fit a node (cp is the next dimension out from tp), else the inter-node
    one. FLOPs are unchanged by cp: every rank computes its ``s/cp`` queries against all keys."""
    if cp <= 1:
        return 0.0
    nbytes = 2 * b * s * model.kv_dim / tp * act_bytes
    per_node = devices_per_node or hw.devices_per_node
    link = hw.intra if (cp * tp <= per_node or hw.inter is None) else hw.inter
    return (2 * collective_time("all_gather", nbytes, cp, link, measured)
            + collective_time("reduce_scatter", nbytes, cp, link, measured))


def cp_local(costs: "LayerCosts", cp: int) -> "LayerCosts":
    """One cp rank's share of a micro-batch's costs: ``s/cp`` tokens of every sequence, so
    every per-token cost (products, the load-balanced causal attention, memory-bound
    kernels, TP exchanges, the head and its loss) divided by ``cp`` (the shorter products'
    efficiency is not re-evaluated)."""
    if cp <= 1:
        return costs
    return dataclasses.replace(costs, **{f.name: getattr(costs, f.name) / cp
                                         for f in fields(costs) if f.name != "measured"})


def tp_overlap(fw: Framework, sp: bool) -> float:
    """The hidden fraction of TP collectives under ``fw`` (0 unless it overlaps them; Megatron
    only with sequence parallelism, hardware.yaml ``frameworks``)."""
    return fw.tp_overlap if (sp or not fw.tp_overlap_needs_sp) else 0.0


def node_of(rank: int, devices_per_node: int) -> int:
    return rank // devices_per_node


def boundary_crosses_node(point: Point, stage: int, devices_per_node: int) -> bool:
    """Whether pipeline stage ``stage`` sends to stage ``stage + 1`` across nodes. Ranks are
    laid out tp fastest, then dp, then pp (Megatron's and DeepSpeed's topology, and
    ``scalestudy.distributed.mesh``): stage ``r`` holds ranks ``[r·k, (r+1)·k)``, ``k = tp·dp``,
    each sending to the rank ``k`` further on."""
    k = point.tp * int(point.dp)
    return any(node_of(x, devices_per_node) != node_of(x + k, devices_per_node)
               for x in range(stage * k, (stage + 1) * k))


def p2p_seconds(point: Point, stage: int, hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Exposed pipeline transfers of one micro-batch on stage ``stage`` (seconds).

    Per neighbouring stage the framework's ``pp_transfers_per_neighbour`` serial transfers
    (activation out, gradient back) of ``b·s·h`` activations (``/tp`` with sequence
    parallelism or when the framework partitions them over TP, plus an intra-node all-gather
    over TP of each received tensor in that case), on the inter-node link where the boundary
    crosses nodes (``boundary_crosses_node``); ``v`` × that with ``v`` virtual stages; minus the
    framework's steady-state overlap (with interleaving only, where so declared)."""
    pp = point.pp
    if pp <= 1:
        return 0.0
    fw = hw.framework
    v = point.parallel.virtual_stages
    tp, sp = point.tp, point.parallel.sequence_parallel and point.tp > 1
    ab = ACT_BYTES[DType(point.train.precision) != DType.FP32]
    full = point.micro_batch * point.seq_len * point.model.hidden * ab
    split = sp or (fw.pp_partitioned and tp > 1)
    msg = full / tp if split else full
    t = 0.0
    for r in (stage - 1, stage):  # the boundaries r|r+1 this stage touches
        if r < 0 or r >= pp - 1:
            continue
        inter = boundary_crosses_node(point, r, hw.devices_per_node) and hw.inter is not None
        link = hw.inter if inter else hw.intra
        one = collective_time("send_recv", msg, 2, link, None if inter else measured)
        gather = (collective_time("all_gather", full, tp, hw.intra, measured)
                  if (fw.pp_partitioned and tp > 1 and not sp) else 0.0)
        t += fw.pp_transfers_per_neighbour * one + gather
    ov = fw.pp_overlap if (v > 1 or not fw.pp_overlap_needs_interleaving) else 0.0
    return v * t * (1.0 - ov)


def pipeline_seconds(slots: list[float], micro_batches: int, virtual: int = 1) -> tuple[float, float]:
    """``(pipeline_s, bubble_s)`` of a 1F1B (or GPipe) schedule whose stage ``r`` takes
    ``slots[r]`` seconds per micro-batch (forward + backward + its communication): ``m``
    slots of the slowest stage plus the fill and drain, the other stages' slots once each
    (the latency of one micro-batch through the pipeline), divided by ``v`` when each rank
    holds ``v`` interleaved stages (Narayanan et al. SC21 §2.2: bubble ``(p-1)/(v·m)`` of the
    ideal time for equal stages). DeepSpeed's TrainSchedule: ``2·(m + p - 1)`` steps."""
    worst = max(slots)
    bubble = (sum(slots) - worst) / virtual
    return micro_batches * worst + bubble, bubble


def dp_comm_seconds(point: Point, params: float, hw: HardwareSpec,
                    measured: Measured | None = None) -> tuple[float, float, str]:
    """``(per_step_s, per_micro_batch_s, link)`` of the data-parallel gradient traffic of a
    device holding ``params`` parameters (gradients at the activation width: 2 bytes in
    bf16/fp16). ``ddp``: one all-reduce; ``zero1``: reduce-scatter of the gradients and
    all-gather of the updated weights (same volume, Rajbhandari et al. 2020), or an all-reduce
    of the gradients and the all-gather where the framework reduces so
    (``Framework.zero1_all_reduce``: DeepSpeed's BF16_Optimizer); ``fsdp_grad_op``:
    reduce-scatter per step and an all-gather per micro-batch; ``fsdp``: two all-gathers per
    micro-batch (forward and backward); where the framework syncs every micro-batch
    (:func:`syncs_every_micro_batch`) the other ``m - 1`` micro-batches' reduce-scatters too,
    spread over the ``m`` micro-batches (the last one's is the step's). Ring costs
    (``collective_time``) on the inter-node link when ``tp·dp`` exceeds a node, at ``dp_members_per_node`` × the per-device NIC share:
    a ring that visits a group's members on one node in a row leaves the node once, so the
    ``devices_per_node / g`` groups of a node share its NICs."""
    dp = int(point.dp)
    if dp <= 1:
        return 0.0, 0.0, "intra"
    ab = ACT_BYTES[DType(point.train.precision) != DType.FP32]
    nbytes = params * ab
    inter = point.tp * dp > hw.devices_per_node and hw.inter is not None
    link = hw.intra
    if inter:
        link = hw.inter.scaled(hw.inter.bandwidth * dp_members_per_node(point, hw.devices_per_node))
    meas = None if inter else measured
    adj = point.tp == 1
    mode = point.parallel.dp_mode
    if mode == DPMode.DDP:
        return collective_time("all_reduce", nbytes, dp, link, meas, adj), 0.0, ("inter" if inter else "intra")
    rs = collective_time("reduce_scatter", nbytes, dp, link, meas, adj)
    ag = collective_time("all_gather", nbytes, dp, link, meas, adj)
    if mode == DPMode.ZERO1:
        if hw.framework.zero1_all_reduce:
            rs = collective_time("all_reduce", nbytes, dp, link, meas, adj)
        return rs + ag, 0.0, ("inter" if inter else "intra")
    gathers = 2 if mode == DPMode.FSDP else 1
    m = max(1, int(point.grad_accum))
    early = rs * (m - 1) / m if syncs_every_micro_batch(point, hw.framework) else 0.0
    return rs, gathers * ag + early, ("inter" if inter else "intra")


def dp_members_per_node(point: Point, devices_per_node: int) -> int:
    """Members of one data-parallel group on one node (ranks laid out tp fastest, then dp):
    ``devices_per_node / tp``, at most ``dp`` and at least 1."""
    return max(1, min(int(point.dp), devices_per_node // point.tp))


def dp_overlap_fraction(point: Point, hw: HardwareSpec, override: float | None = None) -> float:
    """The fraction of the DP traffic that may hide behind backward compute: ``override``
    when given; 0 on a CPU host (``compute_units``: gloo's copies run on the computing cores);
    else the framework's ``dp_overlap`` (no pipeline) or ``dp_overlap_pp``."""
    if override is not None:
        return float(override)
    if hw.compute_units:
        return 0.0
    return hw.framework.dp_overlap_pp if point.pp > 1 else hw.framework.dp_overlap


def dp_exposed_seconds(per_step: float, per_micro_batch: float, micro_batches: int,
                       overlap: float, backward_s: float, compute_s: float,
                       chunks: float | None = None) -> float:
    """Exposed DP seconds per step: the per-step reduction minus ``overlap`` × the backward
    of the last micro-batch (``backward_s``), never below one chunk (``per_step / chunks``)
    when the framework exposes one (Megatron-Core: a layer, or a virtual stage with PP); plus
    the per-micro-batch gathers minus ``overlap`` × that micro-batch's compute, ``m`` times."""
    step = max(0.0, per_step - overlap * backward_s)
    if chunks and overlap > 0:
        step = max(step, per_step / chunks)
    return step + micro_batches * max(0.0, per_micro_batch - overlap * compute_s)


def grad_bytes_of(point: Point, fw: Framework) -> int:
    """Bytes per element of the gradients the backward produces under ``fw``: its
    ``grad_bytes`` where it states one (parameters kept in fp32 under autocast), else the
    training precision's width (16-bit parameters, 4 in fp32)."""
    return fw.grad_bytes or ACT_BYTES[DType(point.train.precision) != DType.FP32]


def grad_accumulation_seconds(params: float, micro_batches: int, mode: str, grad_bytes: int,
                              hw: HardwareSpec, measured: Measured | None = None) -> float:
    """Seconds per step a stage holding ``params`` parameters spends adding each
    micro-batch's gradients to the step's, memory-bound (:func:`elementwise_seconds`): the
    bytes per parameter of ``kernels.grad_accumulation_bytes(mode, grad_bytes)`` for the first
    micro-batch and for each of the other ``micro_batches - 1``. It runs after (or inside)
    each backward on the stage's stream: on its micro-batch slot."""
    per, first = kernels.grad_accumulation_bytes(mode, grad_bytes)
    nbytes = (first + per * max(0, micro_batches - 1)) * params
    return elementwise_seconds(nbytes, hw, measured) if nbytes else 0.0


def syncs_every_micro_batch(point: Point, fw: Framework) -> bool:
    """Whether the point's sharded data parallelism reduce-scatters every micro-batch's
    gradients (FSDP2's default, kept by frameworks that never disable the sync,
    ``Framework.fsdp_sync_every_micro_batch``) rather than accumulating them unsharded; not
    under pipeline stages, whose schedule disables the sync until the last backward
    (``torch.distributed.pipelining`` ``backward_maybe_with_nosync``)."""
    return (fw.fsdp_sync_every_micro_batch and point.pp == 1
            and point.parallel.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))


def tied_grad_seconds(point: Point, hw: HardwareSpec, grad_bytes: int,
                      measured: Measured | None = None) -> float:
    """Seconds of the tied word embedding's gradient all-reduce between the first and the last
    pipeline stage (each holds a copy): ``vocab · hidden / tp`` elements of ``grad_bytes``
    among 2 ranks, once per step after the flush and before the data-parallel reduction, not
    overlapped (DeepSpeed's ``ReduceTiedGrads``: ``dist.all_reduce(weight._hp_grad or
    weight.grad, group)``; Megatron-LM: ``all_reduce(word_embeddings_weight.grad,
    group=mpu.get_embedding_group())``). Every device of the first stage exchanges with its
    peer ``(pp - 1)·tp·dp`` ranks further on, across nodes when the two are on different nodes
    (ranks laid out tp, then dp, then pp). 0 without pipeline stages, tied embeddings or a
    framework that does it (``Framework.tied_grad_all_reduce``)."""
    model, pp = point.model, point.pp
    if pp <= 1 or not model.tied_embeddings or not hw.framework.tied_grad_all_reduce:
        return 0.0
    k = point.tp * int(point.dp)
    far = (pp - 1) * k
    cross = hw.inter is not None and any(
        node_of(x, hw.devices_per_node) != node_of(x + far, hw.devices_per_node)
        for x in range(k))
    nbytes = model.vocab * model.hidden / point.tp * grad_bytes
    return collective_time("all_reduce", nbytes, 2, hw.inter if cross else hw.intra,
                           None if cross else measured, adjacent=far == 1)


# --- per-step terms -------------------------------------------------------------------------


def optimizer_seconds(params: float, hw: HardwareSpec, overhead_s: float = 0.0,
                      clip_s: float = 0.0, measured: Measured | None = None) -> float:
    """AdamW over ``params`` parameters (the optimizer shard): ``OPT_BYTES_TOUCHED`` bytes each,
    memory-bound (:func:`elementwise_seconds`: the measured copy bandwidth, else ``mem_bw ·
    mem_bw_efficiency``), plus its measured dispatch overhead and the gradient-clipping
    all-reduce (seconds)."""
    return elementwise_seconds(OPT_BYTES_TOUCHED * params, hw, measured) + overhead_s + clip_s


def overhead_seconds(overhead: dict, phase: str, layers: float, tp: int) -> float:
    """Framework overhead of ``phase`` (``fwd_bwd`` per micro-batch, ``optimizer`` per step)
    for a stage of ``layers`` layers: ``fixed + per_layer · layers`` (seconds), measured by
    ``microbench overhead`` (``tp_`` figures: under DTensor, used when ``tp > 1``)."""
    pre = "tp_" if tp > 1 and "tp_fwd_bwd_fixed_s" in overhead else ""
    return (overhead.get(f"{pre}{phase}_fixed_s", 0.0)
            + overhead.get(f"{pre}{phase}_per_layer_s", 0.0) * layers)


#: Launches of the output head and its loss per micro-batch: the head's product forward and
#: its two backward products, and the loss kernels (upcast, log-softmax, its backward, cast).
HEAD_LAUNCHES = 3 + 4


def launch_gap_seconds(c: "LayerCosts", layers: float, recomputed: float, last: bool,
                       hw: HardwareSpec) -> float:
    """GPU stream idle time of one micro-batch on a stage (seconds): every kernel launch
    (forward and backward of ``layers`` layers, the forward again of ``recomputed`` ones, the
    head and loss on the last stage) costs ``hw.kernel_gap_s``; 0 where none is declared (a
    CPU host, whose dispatch is measured as ``overhead``)."""
    if not hw.kernel_gap_s:
        return 0.0
    n = layers * (c.launches_fwd + c.launches_bwd) + recomputed * c.launches_fwd
    return hw.kernel_gap_s * (n + (HEAD_LAUNCHES if last else 0))


def local_procs(point: Point, hw: HardwareSpec) -> int:
    """Training processes of ``point`` on one host (node)."""
    return int(point.procs_per_node or min(point.n, hw.devices_per_node))


def oversubscribed(point: Point, hw: HardwareSpec) -> bool:
    """Whether ``point`` runs more processes on a CPU host than it has cores
    (``compute_units``)."""
    return bool(hw.compute_units) and local_procs(point, hw) > hw.compute_units


def sharing_factor(procs: int, factors: dict, cores: int) -> float:
    """The slowdown (dimensionless) of each of ``procs`` processes sharing a host, from the
    measured ``{procs: factor}`` (``microbench.bench_core_sharing``): linear between measured
    counts; beyond the largest measured count ``k`` the cores are shared ``procs / k`` times
    more (``factor(k) · procs / k``); below the smallest, its factor. Without measurements
    ``max(1, procs / cores)``."""
    if not factors:
        return max(1.0, procs / cores)
    ks = sorted(factors)
    if procs >= ks[-1]:
        return factors[ks[-1]] * procs / ks[-1]
    if procs <= ks[0]:
        return factors[ks[0]]
    hi = next(k for k in ks if k >= procs)
    lo = max(k for k in ks if k <= procs)
    if hi == lo:
        return factors[lo]
    w = (procs - lo) / (hi - lo)
    return factors[lo] + w * (factors[hi] - factors[lo])


def core_sharing_slowdown(point: Point, hw: HardwareSpec,
                          measured: Measured | None = None) -> float:
    """How much slower each process computes on a CPU host (``compute_units`` cores) when
    the point's processes share them: the measured factor at its process count when the
    host's sharing was measured (``sharing_factor``), else ``procs / compute_units`` (≥ 1);
    1 on a device that is not shared (a GPU)."""
    if not hw.compute_units:
        return 1.0
    factors = measured.core_sharing if measured is not None else {}
    return sharing_factor(local_procs(point, hw), factors, hw.compute_units)


def collective_sharing(point: Point, hw: HardwareSpec, measured: Measured | None,
                       group: int) -> float:
    """How much slower a collective among ``group`` of the point's processes runs than its
    time from ``collective_time`` (dimensionless, ≥ 1): on a CPU host its copies and
    reductions run on the cores the point's processes share. A collective the host measured
    (``microbench collectives``: the group's processes busy, the others waiting at a barrier)
    already ran at the sharing of ``group`` processes, so it slows by
    ``sharing(P) / sharing(g)`` at the point's ``P`` local processes (``sharing_factor``, ``g``
    at most ``P``); a declared one by ``sharing(P)``. 1 on a device that is not shared."""
    cs = core_sharing_slowdown(point, hw, measured)
    if cs == 1.0 or measured is None or not measured.collectives:
        return cs
    g = max(1, min(int(group), local_procs(point, hw)))
    return max(1.0, cs / sharing_factor(g, measured.core_sharing, hw.compute_units))


def sync_wait_seconds(procs: int, grain_s: float, table: dict) -> float:
    """Seconds one synchronisation of ``procs`` processes sharing a CPU host waits for the
    slowest of them, after ``grain_s`` seconds of compute on each, from the host's measured
    ``table`` (``Measured.sync_wait``): linear in the grain between the measured grains,
    their end values beyond them, never negative; 0 for one process or a count not measured
    (a GPU's own device is not shared: its rank skew is not modelled)."""
    pts = table.get(int(procs)) if procs > 1 else None
    if not pts:
        return 0.0
    if grain_s <= pts[0][0]:
        return max(pts[0][1], 0.0)
    if grain_s >= pts[-1][0]:
        return max(pts[-1][1], 0.0)
    (g0, w0), (g1, w1) = next((a, b) for a, b in zip(pts, pts[1:]) if a[0] <= grain_s <= b[0])
    return max(w0 + (w1 - w0) * (grain_s - g0) / (g1 - g0), 0.0)


def sync_counts(point: Point, hw: HardwareSpec, r: int, layers: int, ckpts: int
                ) -> tuple[int, int]:
    """How often pipeline stage ``r``'s ranks synchronise with others: ``(per micro-batch,
    per step)``. Per micro-batch: the tensor-parallel exchanges (``stage_tp_seconds``' count:
    4 a layer, 2 a recomputed one, the embedding's on the first stage, the head's 2 on the
    last) and the pipeline transfers with each neighbouring stage (the framework's
    ``pp_transfers_per_neighbour``). Per step: the data-parallel gradient reduction (ddp 1;
    zero1 2: reduce-scatter and all-gather; fsdp modes a gather per layer and micro-batch
    are left out: not measured)."""
    tp, pp = point.tp, point.pp
    n_tp = (4 * layers + 2 * ckpts + (r == 0) + 2 * (r == pp - 1)) if tp > 1 else 0
    n_pp = hw.framework.pp_transfers_per_neighbour * ((r > 0) + (r < pp - 1)) if pp > 1 else 0
    dp_syncs = {DPMode.DDP: 1, DPMode.ZERO1: 2}.get(point.parallel.dp_mode, 0)
    return n_tp + n_pp, dp_syncs if int(point.dp) > 1 else 0


def sync_wait_terms(point: Point, hw: HardwareSpec, measured: Measured | None,
                    compute: list[float], layers_of: list[int], ckpts: list[int]
                    ) -> tuple[list[float], float]:
    """``(per pipeline stage: the waits of one micro-batch slot, the data-parallel waits of a
    step)`` in seconds on a CPU host that measured its synchronisations
    (``Measured.sync_wait``): each of ``sync_counts`` after an equal share of the compute
    between them (``compute``: a stage's micro-batch, unshared seconds) waits
    ``sync_wait_seconds`` at the point's process count; nothing elsewhere."""
    pp, m = point.pp, max(1, int(point.grad_accum))
    table = measured.sync_wait if measured is not None else {}
    if not table or not hw.compute_units:
        return [0.0] * pp, 0.0
    procs = local_procs(point, hw)
    waits, n_dp = [], 0
    for r in range(pp):
        per_mb, n_dp = sync_counts(point, hw, r, layers_of[r], ckpts[r])
        waits.append(per_mb * sync_wait_seconds(procs, compute[r] / per_mb, table)
                     if per_mb else 0.0)
    dp = n_dp * sync_wait_seconds(procs, m * max(compute) / n_dp, table) if n_dp else 0.0
    return waits, dp


def composed_stage_seconds(full_s: float, layer_s: float, embedding_s: float, head_s: float,
                           layers: float, stage_layers: float, first: bool, last: bool,
                           recomputed: float = 0.0) -> float:
    """One micro-batch's forward + backward on a pipeline stage from blocks measured on the
    whole model (seconds): the whole micro-batch ``full_s`` less the layers other stages hold
    (``(layers - stage_layers) · layer_s``), less the embedding on all but the first stage and
    the final norm, head and loss (``head_s``) on all but the last; plus a third of a layer
    (its forward again) per recomputed layer. Never below ``stage_layers · layer_s``. With one
    stage: ``full_s`` itself."""
    t = (full_s - (layers - stage_layers) * layer_s - (0.0 if first else embedding_s)
         - (0.0 if last else head_s))
    return max(t, stage_layers * layer_s) + recomputed / 3.0 * layer_s


def composed_optimizer_seconds(optimizer_s: float, optimizer_layer_s: float, layers: float,
                               stage_layers: float) -> float:
    """Clipping + AdamW over a stage's parameters (seconds): the whole model's measured
    ``optimizer_s`` less one layer's (``optimizer_layer_s``) per layer that other stages
    hold; never below ``stage_layers · optimizer_layer_s``."""
    return max(optimizer_s - (layers - stage_layers) * optimizer_layer_s,
               stage_layers * optimizer_layer_s)


def in_step_optimizer(blk: dict) -> tuple[float, float]:
    """(all parameters', one layer's) clipping + AdamW seconds as a step runs them, from the
    measured blocks ``blk``: ``step_optimizer_s`` (the ``step`` block, one micro-batch on
    cleared gradients then the optimizer and ``zero_grad``, less its micro-batch, paired by
    round: ``blocks_from_rows``), else the ``step`` median less the ``fwd_bwd`` median, i.e. the
    optimizer after a backward rather than back to back with itself; one layer's share scaled
    alike. Blocks measured without ``step`` keep the isolated ``optimizer`` block."""
    if "step_s" not in blk or blk["optimizer_s"] <= 0:
        return blk["optimizer_s"], blk["optimizer_layer_s"]
    whole = blk.get("step_optimizer_s", max(blk["step_s"] - blk["fwd_bwd_s"], 0.0))
    return whole, blk["optimizer_layer_s"] * whole / blk["optimizer_s"]


def split_measured_slot(total_s: float, modelled: tuple) -> tuple[tuple, float]:
    """``((gemm, attention, elementwise), overhead)`` of a measured slot of ``total_s``
    seconds: the modelled arithmetic terms as they are and the rest (dispatch, autograd,
    the ops the inventory leaves out) as framework overhead; where the modelled terms exceed
    the measurement they are scaled down to it (overhead 0)."""
    comp = sum(modelled)
    if comp <= total_s or comp <= 0:
        return tuple(modelled), total_s - comp
    k = total_s / comp
    return tuple(x * k for x in modelled), 0.0


# --- the breakdown --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepBreakdown:
    """One optimizer step of a point on a system: the time terms (seconds per step, on the
    bottleneck stage's timeline; they add up to ``step_time_s``) and what follows from them."""

    #: the terms, in the order a stacked bar shows them
    TERMS: ClassVar[tuple[str, ...]] = (
        "gemm_s", "attention_s", "elementwise_s", "grad_accum_s", "overhead_s", "tp_comm_s",
        "pp_p2p_s", "pp_bubble_s", "dp_comm_exposed_s", "optimizer_s", "cp_comm_s",
        "sync_wait_s")

    step_time_s: float
    gemm_s: float
    attention_s: float
    elementwise_s: float
    overhead_s: float
    tp_comm_s: float
    pp_p2p_s: float
    pp_bubble_s: float
    dp_comm_exposed_s: float
    optimizer_s: float
    cp_comm_s: float = 0.0  # context parallelism's K/V exchange (exposed)
    grad_accum_s: float = 0.0  # adding each micro-batch's gradients (memory-bound)
    sync_wait_s: float = 0.0  # a CPU host's ranks waiting for the slowest at synchronisations
    dp_comm_s: float = 0.0  # the DP traffic (and the tied embedding's) before overlap
    bubble_fraction: float = 0.0  # bubble / (m slots of the bottleneck stage)
    micro_batch_slot_s: float = 0.0
    bottleneck_stage: int = 0
    core_sharing_slowdown: float = 1.0
    oversubscribed: bool = False  # more processes than cores on a CPU host
    composed_from_blocks: bool = False  # the micro-batch composed from measured blocks
    tokens_per_step: float = 0.0
    tokens_per_s: float = 0.0
    model_flops_per_step: float = 0.0
    hardware_flops_per_step: float = 0.0
    mfu: float = 0.0
    hfu: float = 0.0
    tflops_per_device: float = 0.0
    matmul_flops_per_s: float = 0.0
    matmul_rate_source: str = "declared"
    dp_overlap: float = 0.0
    dp_link: str = "intra"
    pp_link: str = "intra"
    hardware: str = ""
    framework: str = ""

    @property
    def compute_s(self) -> float:
        """GEMMs + attention + memory-bound kernels."""
        return self.gemm_s + self.attention_s + self.elementwise_s

    def terms(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.TERMS}

    def fractions(self) -> dict[str, float]:
        """Each term as a fraction of the step."""
        return {k: v / self.step_time_s for k, v in self.terms().items()}

    def row(self) -> dict:
        """Every field (and ``compute_s``) as a flat dict, for a table row."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["compute_s"] = self.compute_s
        return d


@dataclass(frozen=True)
class LayerCosts:
    """Seconds of one micro-batch's pieces on one TP rank (``_layer_costs``): per layer the
    dense products forward / backward, the attention core forward / backward, the memory-bound
    kernels (forward + backward; the forward is a third), one TP exchange; the head's product
    forward / backward, its loss kernels, the embedding's and the head's TP exchanges (the
    logits all-gathered, or with a vocabulary-parallel loss three all-reduces of ``b·s`` fp32
    values: Megatron's ``vocab_parallel_cross_entropy``)."""

    gemm_fwd: float
    gemm_bwd: float
    attn_fwd: float
    attn_bwd: float
    elementwise: float
    tp_exchange: float
    head_fwd: float
    head_bwd: float
    loss: float
    tp_embedding: float
    tp_head: float
    measured: bool
    launches_fwd: float = 0.0
    launches_bwd: float = 0.0


def fusion_of(point: Point, fw: Framework) -> str:
    """The fusion level a point's memory-bound kernels run at: the framework's, or
    ``compiled`` when an eager framework compiles the model (``train.compile``)."""
    return "compiled" if (fw.fusion == "eager" and point.train.compile) else fw.fusion


def _layer_costs(point: Point, hw: HardwareSpec, measured: Measured | None) -> LayerCosts:
    model, tp = point.model, point.tp
    b, s = point.micro_batch, model.seq_len
    sp = point.parallel.sequence_parallel and tp > 1
    dtype = DType(point.train.precision)
    ab = ACT_BYTES[dtype != DType.FP32]
    fusion = fusion_of(point, hw.framework)
    g_fwd = g_bwd = 0.0
    sources = set()
    dense = layer_gemms(model, s, b, tp, fused_qkv=hw.framework.fused_qkv)[:-1]
    for M, N, K, count in dense:
        f_, b_, meas = product_seconds(M, N, K, count, dtype, hw, measured)
        g_fwd, g_bwd = g_fwd + f_, g_bwd + b_
        sources.add(meas)
    elem_launches = sum(n for _, _, n in kernels.layer_kernels(model, fusion, tp, sp,
                                                               hw.framework.dropout))
    gemm_launches = sum(c for *_, c in dense)
    a_fwd, a_bwd, meas = attention_seconds(model, s, b, tp, dtype, hw, measured)
    sources.add(meas)
    h_fwd, h_bwd, meas = product_seconds(*head_gemm(model, s, b, tp), dtype, hw, measured)
    sources.add(meas)
    act = b * s * model.hidden * ab
    per = tp_collective_seconds(act, tp, hw, sp, measured)
    return LayerCosts(
        gemm_fwd=g_fwd, gemm_bwd=g_bwd, attn_fwd=a_fwd, attn_bwd=a_bwd,
        elementwise=elementwise_seconds(
            elementwise_bytes(model, s, b, ab, tp, sp, fusion, hw.framework.dropout), hw, measured),
        tp_exchange=per, head_fwd=h_fwd, head_bwd=h_bwd,
        loss=elementwise_seconds(loss_bytes(s, b, model.vocab, tp, fusion, ab), hw, measured),
        tp_embedding=collective_time("all_reduce", act, tp, hw.intra, measured),
        tp_head=(3 * collective_time("all_reduce", b * s * 4, tp, hw.intra, measured)
                 if hw.framework.vocab_parallel_loss else
                 collective_time("all_gather", b * s * model.vocab * ab, tp, hw.intra, measured)),
        measured=True in sources,
        launches_fwd=gemm_launches + 1 + elem_launches,
        launches_bwd=2 * gemm_launches + 1 + kernels.BACKWARD_LAUNCHES * elem_launches)


def stage_terms(c, layers: int, ckpts: int, att_re: float, last: bool
                ) -> tuple[float, float, float]:
    """(gemm, attention, elementwise) seconds of one micro-batch on a stage of ``layers``
    layers, ``ckpts`` of them recomputed: every layer forward + backward, the recomputed
    layers' forward again (``att_re``: the attention recomputed in every layer), the head on
    the ``last`` stage. ``c``: the layer costs."""
    gemm = layers * (c.gemm_fwd + c.gemm_bwd) + ckpts * c.gemm_fwd
    attn = layers * (c.attn_fwd + c.attn_bwd + att_re) + ckpts * c.attn_fwd
    elem = layers * c.elementwise + ckpts * c.elementwise / 3
    if last:
        gemm, elem = gemm + c.head_fwd + c.head_bwd, elem + c.loss
    return gemm, attn, elem


def stage_tp_seconds(c, tp: int, layers: int, ckpts: int, first: bool, last: bool,
                     tp_hidden: float) -> float:
    """A stage's tensor-parallel exchanges of one micro-batch (s): 4 per layer, 2 more per
    recomputed layer; the vocabulary-parallel embedding's all-reduce (``first`` stage); the
    head's loss exchanges (logits all-gather, or Megatron's three small all-reduces) and its
    input-gradient exchange (``last`` stage); minus the framework's overlap ``tp_hidden``."""
    if tp == 1:
        return 0.0
    t = ((4 * layers + 2 * ckpts) * c.tp_exchange + (c.tp_embedding if first else 0.0)
         + ((c.tp_head + c.tp_exchange) if last else 0.0))
    return t * (1.0 - tp_hidden)


def ddp_wrapper_seconds(point: Point, blk: dict) -> float:
    """``DistributedDataParallel``'s own cost per micro-batch (s) of a point it wraps, from
    the measured blocks ``blk``: its forward's bookkeeping on the step's ``m - 1`` micro-batches
    inside ``no_sync`` (``ddp_micro_batch_s``), the reducer's hooks and bucket copies on the
    last one's (``ddp_sync_s``; timed on a one-rank group, its all-reduce a local copy: the
    exchange itself is ``dp_comm_s``), averaged over the ``m``. 0 for another wrapper or
    blocks without them."""
    if point.dp_wrapper != DPWrapper.DDP or "ddp_sync_s" not in blk:
        return 0.0
    m = max(1, int(point.grad_accum))
    return ((m - 1) * blk.get("ddp_micro_batch_s", 0.0) + blk["ddp_sync_s"]) / m


def composed_stages(point: Point, blk: dict, layers_of: list[int], ckpts: list[int],
                    comp: list[tuple[float, float, float]]
                    ) -> tuple[list[tuple[float, float, float]], list[float]]:
    """Each stage's micro-batch composed from the host's measured blocks (``blk``:
    ``Measured.block``): its (gemm, attention, elementwise) seconds scaled from the modelled
    ``comp`` and the rest as overhead (s), the DP wrapper's own cost included
    (``ddp_wrapper_seconds``). The blocks are one rank's (``block_layout``); ``layers_of``,
    ``ckpts``: layers and recomputed layers per pipeline rank."""
    pp, l = point.pp, point.model.layers
    terms, ovhs = list(comp), [0.0] * pp
    wrapper = ddp_wrapper_seconds(point, blk)
    for r in range(pp):
        total = composed_stage_seconds(
            blk["fwd_bwd_s"], blk["layer_s"], blk["embedding_s"], blk["head_s"], l,
            layers_of[r], r == 0, r == pp - 1, ckpts[r])
        terms[r], ovhs[r] = split_measured_slot(total, comp[r])
        ovhs[r] += wrapper
    return terms, ovhs


def dp_step_exposed_seconds(point: Point, hw: HardwareSpec, t_dp_step: float, t_dp_mb: float,
                            ov: float, t_bwd_mb: float, t_comp: float) -> float:
    """The data-parallel communication left exposed (s): the per-step traffic ``t_dp_step``
    and per-micro-batch ``t_dp_mb`` under the overlap fraction ``ov`` of backward ``t_bwd_mb``
    and compute ``t_comp`` of one micro-batch."""
    fw, par = hw.framework, point.parallel
    pp, m = point.pp, max(1, int(point.grad_accum))
    v = par.virtual_stages if pp > 1 else 1
    chunks = (point.model.layers / pp if pp == 1 else v) if fw.dp_exposes_one_chunk else None
    # the distributed optimizer's parameter all-gather (half of zero1's per-step traffic) may
    # run under the next step's first forward instead (Megatron-Core --overlap-param-gather)
    gather = t_dp_step / 2 if (fw.dp_gather_overlap and par.dp_mode == DPMode.ZERO1) else 0.0
    return (dp_exposed_seconds(t_dp_step - gather, t_dp_mb, m, ov, t_bwd_mb, t_comp, chunks)
            + dp_exposed_seconds(gather, 0.0, m, ov, t_comp / 3, t_comp, chunks))


def optimizer_step_seconds(point: Point, params: float, hw: HardwareSpec,
                           measured: Measured | None, blk: dict | None, ovh,
                           layers_of: list[int]) -> tuple[float, float]:
    """(the optimizer's compute on its shard, gradient clipping's norm all-reduce) seconds of
    one step; ``params``: the largest stage's parameters, ``ovh``: the overhead table."""
    par, tp, pp, dp = point.parallel, point.tp, point.pp, int(point.dp)
    opt_params = params / (dp if par.dp_mode != DPMode.DDP else 1)
    sharded = tp > 1 or pp > 1 or (dp > 1 and par.dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))
    clip = (collective_time("all_reduce", 4, point.n, hw.intra, measured)
            if point.train.grad_clip and sharded else 0.0)
    if blk is not None:  # measured on the model's own parameters
        t_opt_comp = composed_optimizer_seconds(*in_step_optimizer(blk), point.model.layers,
                                                max(layers_of))
    else:
        lps = point.model.layers / pp
        t_opt_comp = optimizer_seconds(opt_params, hw, overhead_seconds(ovh, "optimizer", lps, tp),
                                       0.0, measured)
    return t_opt_comp, clip


def predict_step_time(point: Point, hw: HardwareSpec, measured: Measured | None = None,
                      dp_overlap: float | None = None) -> StepBreakdown:
    """The step of ``point`` on ``hw`` as a ``StepBreakdown`` (module doc). ``measured``:
    building blocks measured on the machine (they replace the declared rates where they
    cover a product, a collective or the bandwidth); ``dp_overlap`` overrides the framework's
    DP overlap."""
    model, par = point.model, point.parallel
    tp, pp, n = point.tp, point.pp, point.n
    b, m, s = point.micro_batch, max(1, int(point.grad_accum)), model.seq_len
    l, h, V = model.layers, model.hidden, model.vocab
    v = par.virtual_stages if pp > 1 else 1
    ckpt = par.activation_checkpointing
    sp = par.sequence_parallel and tp > 1
    dtype = DType(point.train.precision)
    fw = hw.framework
    if tp > hw.devices_per_node:
        raise ValueError(f"tp={tp} exceeds devices_per_node={hw.devices_per_node} of hardware {hw.name!r}")
    lps = l / pp
    layers_of = partition.rank_layers(point)  # per pipeline rank (uneven partitions)
    c = cp_local(_layer_costs(point, hw, measured), point.cp)
    att_re = c.attn_fwd if ckpt == Checkpointing.SELECTIVE_ATTENTION else 0.0
    ckpts = [memory.checkpointed_layers(l, pp, r, v, ckpt, partition.stage_layers(point))
             for r in range(pp)]
    t_cp = cp_exchange_seconds(model, s, b, tp, point.cp, ACT_BYTES[dtype != DType.FP32], hw,
                               measured, point.platform.devices_per_node)

    ovh = hw.overhead if measured is None or not measured.overhead else measured.overhead
    t_ovh = overhead_seconds(ovh, "fwd_bwd", lps, tp)
    gaps = [launch_gap_seconds(c, lps, ckpts[r], r == pp - 1, hw) for r in range(pp)]
    tp_hidden = tp_overlap(fw, sp)
    comp = [stage_terms(c, layers_of[r], ckpts[r], att_re, r == pp - 1) for r in range(pp)]
    ovhs = [t_ovh] * pp
    # A CPU host that measured the study's own blocks: each stage's micro-batch is composed
    # from them (the arithmetic terms stay as modelled; the rest is the overhead).
    blk = measured.block(point) if (measured is not None and hw.compute_units) else None
    if blk is not None:
        comp, ovhs = composed_stages(point, blk, layers_of, ckpts, comp)

    tps = [stage_tp_seconds(c, tp, layers_of[r], ckpts[r], r == 0, r == pp - 1, tp_hidden)
           for r in range(pp)]
    p2ps = [p2p_seconds(point, r, hw, measured) for r in range(pp)]
    cps = [(layers_of[r] + ckpts[r] / 2) * t_cp for r in range(pp)]  # recompute: 1 all-gather
    stage_p = [memory.stage_params(model, tp, pp, r, layers_of[r]) for r in range(pp)]
    # gradient accumulation, per micro-batch on each stage (the measured blocks include it;
    # a shard synced every micro-batch adds dp times fewer parameters: not counted)
    gbytes = grad_bytes_of(point, fw)
    local = blk is None and not syncs_every_micro_batch(point, fw)  # else reduce-scattered
    accs = [grad_accumulation_seconds(stage_p[r], m, fw.grad_accumulation, gbytes, hw,
                                      measured) / m if local else 0.0 for r in range(pp)]
    # core sharing slows the computing phases, and each collective as its group's sharing
    # was not already in its time (collective_sharing)
    cs = core_sharing_slowdown(point, hw, measured)
    dp_group = max(1, min(int(point.dp), local_procs(point, hw) // tp))  # its members here
    ms_tp, ms_pp, ms_cp, ms_dp, ms_clip = (collective_sharing(point, hw, measured, g)
                                           for g in (tp, 2, point.cp, dp_group, n))
    local_s = [sum(comp[r]) + ovhs[r] + gaps[r] + accs[r] for r in range(pp)]
    waits, t_dp_wait = sync_wait_terms(point, hw, measured, local_s, layers_of, ckpts)
    slots = [cs * local_s[r] + ms_tp * tps[r] + ms_pp * p2ps[r] + ms_cp * cps[r] + waits[r]
             for r in range(pp)]
    worst = max(range(pp), key=lambda r: slots[r])
    t_pipe, t_bubble = pipeline_seconds(slots, m, v)
    t_comp = sum(comp[worst])
    t_bwd_mb = t_comp * 2 / 3  # backward of one micro-batch (no recompute share)

    # data parallelism: the stage with the most parameters reduces last; before it, the
    # first and the last stage all-reduce their tied embedding's gradient
    params = max(stage_p)
    t_dp_step, t_dp_mb, dp_link = dp_comm_seconds(point, params, hw, measured)
    ov = dp_overlap_fraction(point, hw, dp_overlap)
    t_tied = tied_grad_seconds(point, hw, kernels.accumulated_grad_bytes(
        fw.grad_accumulation, gbytes), measured)
    t_dp_exposed = ms_pp * t_tied + ms_dp * dp_step_exposed_seconds(
        point, hw, t_dp_step, t_dp_mb, ov, t_bwd_mb, t_comp)

    # optimizer on its shard; clipping reduces the squared norm of sharded gradients
    t_opt_comp, clip = optimizer_step_seconds(point, params, hw, measured, blk, ovh, layers_of)
    t_opt = cs * t_opt_comp + ms_clip * clip

    slow = cs
    step = t_pipe + t_dp_exposed + t_opt + t_dp_wait
    gemm, attn, elem = comp[worst]
    gb = int(point.global_batch)
    tokens = gb * s
    mflops = flops.model_flops_per_step(model, gb)
    hflops = flops.hardware_flops_per_step(model, gb, "megatron", ckpt)
    peak = hw.peak(dtype)
    matmul_flops = (lps * flops.layer_forward_flops(model, b) / tp
                    + 2.0 * s * b * h * V / tp) / point.cp  # a cp rank's share
    multi = any(boundary_crosses_node(point, r, hw.devices_per_node) for r in range(pp - 1))
    return StepBreakdown(
        step_time_s=step,
        gemm_s=m * gemm * slow,
        attention_s=m * attn * slow,
        elementwise_s=m * elem * slow,
        overhead_s=m * (ovhs[worst] + gaps[worst]) * slow,
        tp_comm_s=m * tps[worst] * ms_tp,
        pp_p2p_s=m * p2ps[worst] * ms_pp,
        pp_bubble_s=t_bubble,
        dp_comm_exposed_s=t_dp_exposed,
        optimizer_s=t_opt,
        cp_comm_s=m * cps[worst] * ms_cp,
        grad_accum_s=m * accs[worst] * slow,
        sync_wait_s=m * waits[worst] + t_dp_wait,
        dp_comm_s=ms_pp * t_tied + ms_dp * (t_dp_step + m * t_dp_mb),
        bubble_fraction=t_bubble / (m * slots[worst]),
        micro_batch_slot_s=slots[worst],
        bottleneck_stage=worst,
        core_sharing_slowdown=slow,
        oversubscribed=oversubscribed(point, hw),
        composed_from_blocks=blk is not None,
        tokens_per_step=tokens,
        tokens_per_s=tokens / step,
        model_flops_per_step=mflops,
        hardware_flops_per_step=hflops,
        mfu=flops.utilisation(mflops, step, n, peak),
        hfu=flops.utilisation(hflops, step, n, peak),
        tflops_per_device=hflops / (step * n) / 1e12,
        matmul_flops_per_s=matmul_flops / (lps * (c.gemm_fwd + c.attn_fwd) + c.head_fwd),
        matmul_rate_source="measured" if c.measured else "declared",
        dp_overlap=ov,
        dp_link=dp_link,
        pp_link="inter" if (pp > 1 and multi and hw.inter is not None) else "intra",
        hardware=hw.name,
        framework=fw.name,
    )


@dataclass(frozen=True)
class Prediction:
    """A point's central breakdown and its range: ``low`` / ``high`` are the shortest and
    longest step over ``hw.scenarios()`` (every assumption at the ends of its stated range),
    ``scenarios`` every scenario's breakdown by label."""

    central: StepBreakdown
    scenarios: dict = field(default_factory=dict)

    @property
    def step_time_low_s(self) -> float:
        return min(b.step_time_s for b in self.scenarios.values())

    @property
    def step_time_high_s(self) -> float:
        return max(b.step_time_s for b in self.scenarios.values())


def predict_range(point: Point, hw: HardwareSpec, measured: Measured | None = None,
                  dp_overlap: float | None = None) -> Prediction:
    """``predict_step_time`` under every scenario of ``hw.scenarios()``."""
    sc = {label: predict_step_time(point, h, measured, dp_overlap) for label, h in hw.scenarios()}
    return Prediction(central=sc["central"], scenarios=sc)


__all__ = [
    "HardwareSpec", "Link", "Measured", "Prediction", "StepBreakdown", "attention_seconds",
    "block_key", "block_layout", "block_layout_tp", "blocks_from_rows", "boundary_crosses_node", "collective_time",
    "ddp_wrapper_seconds", "PAIRED_BLOCKS",
    "composed_optimizer_seconds", "composed_stage_seconds",
    "in_step_optimizer", "sync_counts", "sync_wait_from_rows", "sync_wait_seconds",
    "sync_wait_terms",
    "collective_sharing", "core_sharing_from_rows", "core_sharing_slowdown", "cp_exchange_seconds", "cp_local",
    "dp_comm_seconds", "dp_exposed_seconds", "dp_overlap_fraction", "elementwise_bytes",
    "elementwise_seconds", "gemm_efficiency", "grad_accumulation_seconds", "grad_bytes_of",
    "local_procs", "oversubscribed", "syncs_every_micro_batch", "tied_grad_seconds",
    "sharing_factor", "split_measured_slot",
    "gemm_seconds", "gemm_shapes", "layer_gemms", "optimizer_seconds", "p2p_seconds",
    "pipeline_seconds", "predict_range", "predict_step_time", "presets", "product_seconds",
    "spec_from_microbench", "tile_wave_efficiency", "tp_collective_seconds",
]
