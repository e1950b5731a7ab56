"""Predicted step time of a training point from its hardware's building blocks.

``predict_step_time(point, hw, measured=None)`` is a pure, analytic model (no fitting to any
published result). For the most loaded pipeline stage and one micro-batch of ``b`` sequences
of ``s`` tokens (hidden ``h``, ``a`` heads, MLP width ``f``, vocabulary ``V``):

1. **Compute.** Forward FLOPs per layer ``2·(4h² + k·h·f)·s·b + 4·s²·h·b`` (``k`` = 2 MLP
   matrices for GELU, 3 for SwiGLU), the output head ``2·s·b·h·V`` on the last stage, all
   divided by ``tp``; training = 3 × forward, plus one more forward of every recomputed
   layer (``full``: all; ``selective``: those with an even global index, as
   ``scalestudy.distributed.engine`` runs it; ``selective_attention``: the attention core,
   ``4·s²·h·b``). Time = FLOPs / rate, where the rate is the
   *measured* matmul throughput of the device for the dtype at the nearest measured shape
   (per product: projections, MLP, attention ``Q K^T``/``A V``, head; a measured fused
   attention kernel when there is one) when ``measured`` has it, else ``peak ×
   matmul_efficiency`` declared by the hardware preset. Non-matmul kernels (LayerNorm,
   residual adds, GELU/SwiGLU, log-softmax) are memory-bound: their bytes
   (``elementwise_bytes``) at ``mem_bw``. Framework overhead (dispatch, autograd, clipping
   and optimizer bookkeeping) per micro-batch and per layer is added when measured
   (``microbench overhead``) or declared (``overhead:`` in the preset; 0 for GPUs, whose
   asynchronous launches hide it behind large kernels); with ``tp > 1`` the ``tp_`` figures
   apply, measured with the model under DTensor on a one-rank mesh (DTensor's per-op
   dispatch, which on a CPU costs more than the tiny model's arithmetic).
2. **Tensor-parallel collectives.** Megatron TP does 2 all-reduces of ``b·s·h`` activations
   per layer in the forward pass and 2 in the backward (2 more for every layer whose
   forward is re-run); sequence parallelism swaps each for an all-gather + reduce-scatter
   of the same total volume. The vocabulary-sharded embedding adds one all-reduce (first
   stage), the head an all-gather of the logits and an all-reduce of its input gradient
   (last stage). Ring cost ``α + 2(p-1)/p · n/β`` with the intra-node link (TP stays in a
   node). Not overlapped with compute.
3. **Pipeline.** Each micro-batch sends its ``b·s·h`` activations forward and their
   gradient backward (``α + n/β``; inter-node link when the job spans nodes). With ``m``
   micro-batches and ``v`` virtual stages the step takes ``(m + (pp-1)/v)`` micro-batch slots
   of the bottleneck stage: bubble fraction ``(pp-1)/(m·v)`` (GPipe and 1F1B alike;
   interleaving divides it by ``v`` but multiplies the p2p transfers by ``v``).
4. **Data-parallel gradients.** Bytes = parameters on the device × gradient bytes.
   ``ddp``: all-reduce (``2(d-1)/d · n/β``); ``zero1``: reduce-scatter of gradients +
   all-gather of updated weights (same volume); ``fsdp_grad_op``: reduce-scatter + one
   all-gather of the weights per micro-batch; ``fsdp``: reduce-scatter + two all-gathers per
   micro-batch (forward and backward). The inter-node link applies when ``tp·dp`` exceeds a
   node. A fraction ``dp_overlap`` of it hides behind backward compute (the last
   micro-batch's backward; FSDP's per-micro-batch gathers behind that micro-batch's compute).
   Default ``dp_overlap``: 1 without PP, 0 with PP (the pipeline engines of DeepSpeed and
   ``torch.distributed.pipelining`` reduce gradients after the flush), and 0 on a CPU host
   (``compute_units`` declared): gloo's transfers run on the cores that compute.
5. **Shared cores.** A CPU host declares ``compute_units`` (cores): when it runs more
   processes than that, every phase of the step (compute, dispatch, gloo's copies) takes
   ``procs / compute_units`` times longer.
6. **Optimizer.** AdamW is memory-bound: 28 bytes touched per parameter of the optimizer
   shard (read weight/gradient/moments/master, write them back) at ``mem_bw``; gradient
   clipping of sharded gradients (TP, PP, FSDP) adds one small all-reduce.

Step time = pipeline (compute + TP collectives + p2p of every micro-batch slot, bubble
included) + exposed DP time + optimizer. Not modelled: kernel-launch gaps on GPUs, load
imbalance between stages other than the head, network contention between concurrent
collectives beyond the per-device NIC share, the operating system's scheduling of more
processes than cores beyond the ``compute_units`` slowdown, and stragglers. Where these
matter the model under-predicts: it is a lower bound on the step time of a correct trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from scalestudy.config.point import Model, Point
from scalestudy.config.vocab import Checkpointing, DPMode, DType, MLP
from scalestudy.perf import flops, memory
from scalestudy.perf.hardware import HardwareSpec, Link, presets

ACT_BYTES = {True: 2, False: 4}
OPT_BYTES_TOUCHED = 28  # AdamW: read w, g, m, v (+master), write them back (bytes/param)


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
    ``t = α + bytes/β`` over message sizes."""

    matmul: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)
    overhead: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    mem_bw: float | None = None

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
        """The matmul ceiling a study measured during its run (``calibration.json`` of
        ``scalestudy.measure.calibrate``: dtype, m, n, k, flops_per_s)."""
        import json

        with open(path) as f:
            c = json.load(f)
        rows = [(int(c["m"]), int(c["n"]), int(c["k"]), float(c["flops_per_s"]))]
        rows += [(int(r["m"]), int(r["n"]), int(r["k"]), float(r["flops_per_s"]))
                 for r in c.get("shapes") or []]
        return cls(matmul={c["dtype"]: rows})

    @classmethod
    def from_csv(cls, matmul_csv: str | None = None, collectives_csv: str | None = None,
                 overhead_csv: str | None = None) -> "Measured":
        import pandas as pd

        return cls.from_frames(*(pd.read_csv(p) if p else None
                                 for p in (matmul_csv, collectives_csv, overhead_csv)))

    @classmethod
    def from_frames(cls, matmul=None, collectives=None, overhead=None, attention=None,
                    bandwidth=None, stat: str = "median") -> "Measured":
        """From microbench tables (DataFrames or lists of row dicts; ``None`` to skip).
        ``stat``: ``median`` over samples, or ``best`` (fastest sample: on a shared host
        contention only adds time, so the best sample estimates the uncontended rate)."""
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
        return cls(matmul=mm, collectives=coll, overhead=ovh, attention=att, mem_bw=bw)


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
    ``(p-1)/p``, send/recv 1), or the measured fit when ``measured`` has one."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    if measured is not None:
        t = measured.collective_time(op, nbytes, group)
        if t is not None:
            return t
    return link.latency + _bus_factor(op, group) * nbytes / link.bw(group, adjacent)


# --- the model ------------------------------------------------------------------------------


def layer_gemms(model: Model, s: int, b: int, tp: int = 1, attention_only: bool = False) -> list:
    """The forward matrix products of one layer on one TP rank as ``(M, N, K, count)``:
    q/k/v/o projections, the MLP matrices, and the two attention products per head
    (``Q K^T`` and ``A V``, ``2·s·s·head_dim`` FLOPs each)."""
    h, f, a = model.hidden, model.ffn, model.heads
    attn = [(s, s, model.head_dim, 2 * b * a / tp)]
    if attention_only:
        return attn
    return [(b * s, h / tp, h, 4), (b * s, f / tp, h, model.mlp_matrices)] + attn


def gemm_shapes(points) -> list[tuple[int, int, int]]:
    """The distinct forward matrix products ``(M, N, K)`` of the feasible points (per TP rank:
    projections, MLP, attention, head), for measuring them where the study runs
    (``scalestudy.measure.calibrate --shapes``)."""
    shapes = set()
    for p in points:
        if not p.feasible:
            continue
        model, tp, s, b = p.model, p.tp, p.seq_len, p.micro_batch
        for M, N, K, _ in layer_gemms(model, s, b, tp) + [(b * s, model.vocab / tp,
                                                           model.hidden, 1)]:
            shapes.add((int(M), int(N), int(K)))
    return sorted(shapes)


def elementwise_bytes(model: Model, s: int, b: int, act_bytes: int, tp: int = 1,
                      sp: bool = False) -> float:
    """Memory traffic of one layer's non-matmul operations, forward + backward, on one TP
    rank: per token the forward reads and writes two LayerNorms (2h each), two residual
    adds (3h each), the attention output relayout (2h) and the activation function (GELU:
    2f; SwiGLU: 5f); the backward moves about twice as much. Bytes."""
    h, f = model.hidden, model.ffn
    act = (5 if model.mlp == MLP.SWIGLU else 2) * f / tp
    hwide = 12 * h / (tp if sp else 1)
    return 3.0 * (hwide + act) * s * b * act_bytes


def predict_step_time(point: Point, hw: HardwareSpec, measured: Measured | None = None,
                      dp_overlap: float | None = None) -> dict:
    """Predicted seconds per optimizer step of ``point`` on ``hw`` and its components
    (module doc). Returns seconds (``*_s``), FLOPs, ``mfu`` / ``hfu`` (fractions of the
    dtype's spec peak), ``tokens_per_s`` and the assumptions used."""
    model, par = point.model, point.parallel
    tp, pp, dp, n = point.tp, point.pp, int(point.dp), point.n
    b, m, s = point.micro_batch, max(1, int(point.grad_accum)), model.seq_len
    l, h, V = model.layers, model.hidden, model.vocab
    v = par.virtual_stages if pp > 1 else 1
    ckpt = par.activation_checkpointing
    dp_mode = par.dp_mode
    sp = par.sequence_parallel and tp > 1
    dtype = DType(point.train.precision)
    half = dtype != DType.FP32
    ab = ACT_BYTES[half]
    dpn = hw.devices_per_node
    if tp > dpn:
        raise ValueError(f"tp={tp} exceeds devices_per_node={dpn} of hardware {hw.name!r}")

    # 1. compute per micro-batch on the bottleneck (last) stage
    lps = l / pp
    rate_source = "declared"

    def fwd_time(gemms) -> float:
        nonlocal rate_source
        total = 0.0
        for M, N, K, count in gemms:
            if M == N == s and K == model.head_dim and measured is not None:
                r = measured.attention_rate(dtype, s, K)  # the fused attention kernel
            else:
                r = None
            r = r or (measured.matmul_rate(dtype, M, N, K) if measured is not None else None)
            if r:
                rate_source = "measured"
            else:
                r = hw.peak(dtype) * hw.matmul_efficiency
            total += 2.0 * M * N * K * count / r
        return total

    layer_t = fwd_time(layer_gemms(model, s, b, tp))
    attn_t = fwd_time(layer_gemms(model, s, b, tp, attention_only=True))
    head_t = fwd_time([(b * s, V / tp, h, 1)])
    bw = (measured.mem_bw if measured is not None and measured.mem_bw else None) or hw.mem_bw
    ew_layer = elementwise_bytes(model, s, b, ab, tp, sp) / bw
    ew_head = 5.0 * b * s * V / tp * 4 / bw  # fp32 log-softmax + its backward
    ckpts = [memory.checkpointed_layers(l, pp, r, v, ckpt) for r in range(pp)]
    att_re = attn_t if ckpt == Checkpointing.SELECTIVE_ATTENTION else 0.0  # attention core recompute

    def stage_compute(r: int) -> float:
        t_r = lps * (3 * layer_t + ew_layer + att_re) + ckpts[r] * (layer_t + ew_layer / 3)
        return t_r + ((3 * head_t + ew_head) if r == pp - 1 else 0.0)

    ovh = hw.overhead if measured is None or not measured.overhead else measured.overhead
    pre = "tp_" if tp > 1 and "tp_fwd_bwd_fixed_s" in ovh else ""  # DTensor's dispatch

    def overhead(phase: str) -> float:
        return ovh.get(f"{pre}{phase}_fixed_s", 0.0) + ovh.get(f"{pre}{phase}_per_layer_s", 0.0) * lps

    t_ovh_mb = overhead("fwd_bwd")

    # 2. tensor parallel: 4 per layer, 2 more per fully recomputed layer
    act_msg = b * s * h * ab
    if sp:
        per = (collective_time("all_gather", act_msg, tp, hw.intra, measured)
               + collective_time("reduce_scatter", act_msg, tp, hw.intra, measured))
    else:
        per = collective_time("all_reduce", act_msg, tp, hw.intra, measured)

    # the vocabulary-sharded embedding's all-reduce (first stage); the head's logits
    # all-gather and its input-gradient all-reduce (last stage)
    emb = collective_time("all_reduce", act_msg, tp, hw.intra, measured)
    head = collective_time("all_gather", b * s * V * ab, tp, hw.intra, measured) + per

    def stage_tp(r: int) -> float:
        if tp == 1:
            return 0.0
        return ((4 * lps + 2 * ckpts[r]) * per + (emb if r == 0 else 0.0)
                + (head if r == pp - 1 else 0.0))

    worst = max(range(pp), key=lambda r: stage_compute(r) + stage_tp(r))  # the bottleneck
    t_comp, t_tp = stage_compute(worst), stage_tp(worst)
    t_bwd_mb = t_comp * 2 / 3  # backward of one micro-batch (no recompute share)

    # 3. pipeline
    multi_node = n > dpn
    p2p_link = hw.inter if (multi_node and hw.inter) else hw.intra
    p2p_msg = act_msg / (tp if sp else 1)
    t_p2p = 0.0
    if pp > 1:
        t_p2p = 2 * v * collective_time("send_recv", p2p_msg, 2, p2p_link,
                                        measured if not multi_node else None)
    t_slot = t_comp + t_ovh_mb + t_tp + t_p2p
    slots = m + (pp - 1) / v if pp > 1 else m
    t_pipe = slots * t_slot
    t_bubble = (slots - m) * t_slot

    # 4. data parallel
    params_dev = memory.estimate(point)["params_per_device"]
    grad_bytes = params_dev * ab
    dp_inter = tp * dp > dpn and hw.inter is not None
    dp_link = hw.inter if dp_inter else hw.intra
    dp_meas = None if dp_inter else measured
    adj = tp == 1
    t_dp_step = t_dp_mb = 0.0
    if dp > 1:
        if dp_mode == DPMode.DDP:
            t_dp_step = collective_time("all_reduce", grad_bytes, dp, dp_link, dp_meas, adj)
        elif dp_mode == DPMode.ZERO1:
            t_dp_step = (collective_time("reduce_scatter", grad_bytes, dp, dp_link, dp_meas, adj)
                         + collective_time("all_gather", grad_bytes, dp, dp_link, dp_meas, adj))
        else:  # fsdp_grad_op, fsdp
            t_dp_step = collective_time("reduce_scatter", grad_bytes, dp, dp_link, dp_meas, adj)
            gathers = 2 if dp_mode == DPMode.FSDP else 1
            t_dp_mb = gathers * collective_time("all_gather", grad_bytes, dp, dp_link, dp_meas, adj)
    if dp_overlap is not None:
        ov = float(dp_overlap)
    else:  # a CPU host has no engine of its own for gloo's transfers: its cores compute
        ov = 0.0 if (pp > 1 or hw.compute_units) else 1.0
    exposed_step = max(0.0, t_dp_step - ov * t_bwd_mb)
    exposed_mb = max(0.0, t_dp_mb - ov * t_comp) * m
    t_dp_exposed = exposed_step + exposed_mb

    # 5. optimizer
    opt_params = params_dev / (dp if dp_mode != DPMode.DDP else 1)
    # gradient clipping reduces the squared norm of sharded gradients (DTensor, stages)
    clip = point.train.grad_clip
    sharded = tp > 1 or pp > 1 or (dp > 1 and dp_mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP))
    t_clip = collective_time("all_reduce", 4, n, hw.intra, measured) if clip and sharded else 0.0
    t_opt = OPT_BYTES_TOUCHED * opt_params / hw.mem_bw + overhead("optimizer") + t_clip

    # a CPU host whose processes outnumber its cores: every phase (compute, dispatch, gloo's
    # copies) runs on a time-shared core, that much slower
    slow = 1.0
    if hw.compute_units:
        local = point.procs_per_node or min(n, dpn)
        slow = max(1.0, local / hw.compute_units)
    step = slow * (t_pipe + t_dp_exposed + t_opt)
    gb = int(point.global_batch)
    tokens = gb * s
    mflops = flops.model_flops_per_step(model, gb)
    hflops = flops.hardware_flops_per_step(model, gb, "megatron", ckpt)
    peak = hw.peak(dtype)
    return {
        "step_time_s": step,
        "compute_s": m * t_comp * slow,
        "core_sharing_slowdown": slow,
        "overhead_s": m * t_ovh_mb * slow,
        "attention_s": m * slow * (lps * (3 * attn_t + att_re) + ckpts[worst] * attn_t),
        "elementwise_s": m * slow * (lps * ew_layer + ckpts[worst] * ew_layer / 3
                                     + (ew_head if worst == pp - 1 else 0.0)),
        "bottleneck_stage": worst,
        "tp_comm_s": m * t_tp * slow,
        "pp_p2p_s": m * t_p2p * slow,
        "pp_bubble_s": t_bubble * slow,
        "bubble_fraction": (slots - m) / m,
        "dp_comm_s": (t_dp_step + m * t_dp_mb) * slow,
        "dp_comm_exposed_s": t_dp_exposed * slow,
        "optimizer_s": t_opt * slow,
        "micro_batch_slot_s": t_slot * slow,
        "tokens_per_step": tokens,
        "tokens_per_s": tokens / step,
        "model_flops_per_step": mflops,
        "hardware_flops_per_step": hflops,
        "mfu": mflops / (step * n * peak),
        "hfu": hflops / (step * n * peak),
        "tflops_per_device": hflops / (step * n) / 1e12,
        "matmul_flops_per_s": (lps * flops.layer_forward_flops(model, b) / tp + 2.0 * s * b * h * V / tp)
        / (lps * layer_t + head_t),
        "matmul_rate_source": rate_source,
        "dp_overlap": ov,
        "dp_link": "inter" if dp_inter else "intra",
        "pp_link": "inter" if (pp > 1 and multi_node) else "intra",
        "hardware": hw.name,
    }


__all__ = [
    "HardwareSpec", "Link", "Measured", "collective_time", "gemm_shapes", "predict_step_time",
    "presets", "spec_from_microbench",
]
