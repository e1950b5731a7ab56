"""What the step model returns: a point's step as its terms (``StepBreakdown``) and its range
over the system's stated assumptions (``Prediction``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from scalestudy.record.terms import STEP_TERMS


@dataclass(frozen=True)
class StepBreakdown:
    """One optimizer step of a point on a system: the time terms (seconds per step, on the
    bottleneck stage's timeline; they add up to ``step_time_s``) and what follows from them."""

    #: the terms, in the order a stacked bar shows them (the vocabulary a trace reads too)
    TERMS: ClassVar[tuple[str, ...]] = STEP_TERMS

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
    core_wait_s: float = 0.0  # a CPU host's ranks waiting for a core (the cores' sharing)
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
