"""The named terms of a training step: one vocabulary for the step as the performance model
prices it (``scalestudy.perf.breakdown.StepBreakdown``) and as a profiler trace measures it
(``scalestudy.record.trace_terms``), so that the two sit side by side term by term.

Every term is seconds per optimizer step on one rank's timeline; the step's terms add up to
its time. The order is the order of a stacked bar.
"""

from __future__ import annotations

#: The terms both the model and a trace give (the model's ``StepBreakdown.TERMS``).
STEP_TERMS: tuple[str, ...] = (
    "gemm_s", "attention_s", "elementwise_s", "grad_accum_s", "overhead_s", "tp_comm_s",
    "pp_p2p_s", "pp_bubble_s", "dp_comm_exposed_s", "optimizer_s", "cp_comm_s", "core_wait_s",
    "sync_wait_s")

#: Terms only a trace gives: moving the batch in (``data_s``) and the part of the step the
#: trace cannot attribute (``unattributed_s``: the residual, never spread over the others;
#: set against a timed step, also the timed step's difference from the traced one).
MEASURED_ONLY: tuple[str, ...] = ("data_s", "unattributed_s")

#: Every term of a measured step, in stacked-bar order (they add up to the step).
MEASURED_TERMS: tuple[str, ...] = STEP_TERMS[:-1] + ("data_s", "sync_wait_s", "unattributed_s")

#: Communication hidden behind compute (not part of the step's sum): per kind, the time its
#: transfers ran while the rank computed.
OVERLAPPED_TERMS: tuple[str, ...] = ("tp_comm_overlapped_s", "pp_p2p_overlapped_s",
                                     "dp_comm_overlapped_s", "cp_comm_overlapped_s")

#: The exposed communication term of each kind of traffic.
COMM_TERM = {"tp": "tp_comm_s", "pp": "pp_p2p_s", "dp": "dp_comm_exposed_s", "cp": "cp_comm_s"}
#: The overlapped term of each kind (``OVERLAPPED_TERMS``).
OVERLAP_TERM = {"tp": "tp_comm_overlapped_s", "pp": "pp_p2p_overlapped_s",
                "dp": "dp_comm_overlapped_s", "cp": "cp_comm_overlapped_s"}

#: Terms of the rank's own work (host or device): what a straggler's delay lengthens, and
#: what a weak series with constant work per device must keep constant.
WORK_TERMS: tuple[str, ...] = ("gemm_s", "attention_s", "elementwise_s", "grad_accum_s",
                               "overhead_s", "optimizer_s", "data_s")

#: Terms that are time spent waiting for a transfer or a peer rather than host or device
#: work: a profiler's per-event cost does not lengthen them (``breakdown.scaled_terms``).
WAIT_TERMS: tuple[str, ...] = ("tp_comm_s", "pp_p2p_s", "dp_comm_exposed_s", "cp_comm_s",
                               "sync_wait_s")

#: Legend labels of the terms, in stacked-bar order.
TERM_LABELS = {
    "gemm_s": "GEMMs", "attention_s": "attention", "elementwise_s": "memory-bound kernels",
    "grad_accum_s": "gradient accumulation", "overhead_s": "framework overhead",
    "tp_comm_s": "TP comm (exposed)", "pp_p2p_s": "PP p2p (exposed)",
    "pp_bubble_s": "pipeline bubble",
    "dp_comm_exposed_s": "DP and tied-embedding comm (exposed)", "optimizer_s": "optimizer",
    "cp_comm_s": "CP K/V exchange (exposed)", "data_s": "data (batch in)",
    "sync_wait_s": "waiting for the slowest rank",
    "core_wait_s": "waiting for a CPU core (core sharing)",
    "unattributed_s": "unattributed (the trace cannot say, or timed − traced step)",
    "eval_s": "evaluation (in the logged time)",
}


def term_name(term: str) -> str:
    """A term's short name without the unit (``dp_comm_exposed_s`` -> ``dp_comm_exposed``)."""
    return term[:-2] if term.endswith("_s") else term
