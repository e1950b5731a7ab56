"""Corrections of the step on a CPU host, where the point's processes share the cores.

``correct`` is the one entry point: on a host that measured the study's own model piece by
piece (``Measured.blocks``, the calibrate job) each stage's micro-batch and the optimizer are
composed from those blocks (``composed_stages``, ``composed_optimizer_seconds``; under TP
timed on one rank of the point's mesh, ``block_layout``): the arithmetic terms stay as
modelled and the measured rest is overhead (``split_measured_slot``). The computing phases
slow by the sharing of the cores (``core_sharing_slowdown``: measured where the host's
sharing was, ``Measured.core_sharing``, else ``procs / compute_units`` when they outnumber
the cores; what it adds to the work is the step's ``core_wait_s`` term, waiting for a CPU
core, the term a trace measures under the same name: ``perf.stepmodel``), each collective by
the sharing its time does not already carry
(``collective_sharing``: a measured one ran with only its group's processes busy), and every
synchronisation waits for the slowest rank where the host measured that
(``sync_wait_terms``). On a device that is not shared (a GPU) nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scalestudy.config.point import DPWrapper, Point
from scalestudy.config.vocab import DPMode
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import Measured


@dataclass(frozen=True)
class StageWork:
    """One micro-batch's own work on each pipeline stage, unshared (seconds; lists by
    pipeline rank): the arithmetic ``(gemm, attention, elementwise)``, the framework overhead,
    the kernel-launch gaps and the gradient accumulation; and the step's optimizer compute."""

    arithmetic: list
    overhead: list
    gaps: list
    grad_accum: list
    optimizer: float

    def local(self, r: int) -> float:
        """Stage ``r``'s micro-batch on its own cores: the sum of its work."""
        return sum(self.arithmetic[r]) + self.overhead[r] + self.gaps[r] + self.grad_accum[r]


@dataclass(frozen=True)
class HostCorrection:
    """What ``correct`` makes of a point's work on its system: the work itself (composed from
    the measured blocks where ``composed``), the slowdown of computing (``compute``) and of
    the collectives of each group (``tp``, ``pp``: a pipeline transfer or the tied
    embedding's all-reduce, ``cp``, ``dp``, ``clip``: all ranks), the waits for the slowest
    rank (``waits``: per stage and micro-batch; ``dp_wait``: a step's data-parallel ones),
    and whether the point has more processes than cores (``oversubscribed``)."""

    work: StageWork
    compute: float
    tp: float
    pp: float
    cp: float
    dp: float
    clip: float
    waits: list
    dp_wait: float
    oversubscribed: bool
    composed: bool


def correct(point: Point, hw: HardwareSpec, measured: Measured | None, work: StageWork,
            layers_of: list[int], ckpts: list[int]) -> HostCorrection:
    """``point``'s modelled ``work`` corrected for the host it runs on (module doc): composed
    from the measured blocks (the blocks include the gradient accumulation), slowed by the
    sharing of the cores, with the waits at its synchronisations. ``layers_of``, ``ckpts``:
    layers and recomputed layers per pipeline rank."""
    blk = measured.block(point) if (measured is not None and hw.compute_units) else None
    if blk is not None:
        arithmetic, overhead = composed_stages(point, blk, layers_of, ckpts, work.arithmetic)
        work = replace(work, arithmetic=arithmetic, overhead=overhead,
                       grad_accum=[0.0] * point.pp,
                       optimizer=composed_optimizer_seconds(*in_step_optimizer(blk),
                                                            point.model.layers, max(layers_of)))
    dp_group = max(1, min(int(point.dp), local_procs(point, hw) // point.tp))  # its members here
    tp, pp, cp, dp, clip = (collective_sharing(point, hw, measured, g)
                            for g in (point.tp, 2, point.cp, dp_group, point.n))
    waits, dp_wait = sync_wait_terms(point, hw, measured.sync_wait if measured is not None else {},
                                     [work.local(r) for r in range(point.pp)], layers_of, ckpts)
    return HostCorrection(work=work, compute=core_sharing_slowdown(point, hw, measured), tp=tp,
                          pp=pp, cp=cp, dp=dp, clip=clip, waits=waits, dp_wait=dp_wait,
                          oversubscribed=oversubscribed(point, hw), composed=blk is not None)


# --- the cores' sharing ---------------------------------------------------------------------


def local_procs(point: Point, hw: HardwareSpec) -> int:
    """Training processes of ``point`` on one host (node)."""
    return int(point.procs_per_node or min(point.n, hw.devices_per_node))


def oversubscribed(point: Point, hw: HardwareSpec) -> bool:
    """Whether ``point`` runs more processes on a CPU host than it has cores
    (``compute_units``)."""
    return bool(hw.compute_units) and local_procs(point, hw) > hw.compute_units


def sharing_factor(procs: int, factors: dict, cores: int) -> float:
    """The slowdown (dimensionless) of each of ``procs`` processes sharing a host, from the
    measured ``{procs: factor}`` (``host_sharing.bench_core_sharing``): linear between measured
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


# --- waiting for the slowest rank ------------------------------------------------------------


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


def sync_wait_terms(point: Point, hw: HardwareSpec, table: dict,
                    compute: list[float], layers_of: list[int], ckpts: list[int]
                    ) -> tuple[list[float], float]:
    """``(per pipeline stage: the waits of one micro-batch slot, the data-parallel waits of a
    step)`` in seconds on a CPU host that measured its synchronisations
    (``table``: ``Measured.sync_wait``): each of ``sync_counts`` after an equal share of the compute
    between them (``compute``: a stage's micro-batch, unshared seconds) waits
    ``sync_wait_seconds`` at the point's process count; nothing elsewhere."""
    pp, m = point.pp, max(1, int(point.grad_accum))
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


# --- the micro-batch composed from measured blocks -------------------------------------------


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
