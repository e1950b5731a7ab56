"""Holistic Trace Analysis (HTA, PyPI ``traceinsight``; the ``hta`` extra) beside the
project's own reading of a device trace: HTA's temporal breakdown (idle, compute and
non-compute time per rank, as shares of its kernels' span) against the project's terms of
the same rank's profiled steps regrouped the same way (``StepReading.device``: compute, the
exposed communication and memory kernels, the device idle, as shares of the steps), and
HTA's communication/computation overlap against ``timeline.device_temporal``'s. HTA reads
device (GPU) stream events only; on a CPU trace there is nothing for it to read.

Agreement: each of the idle, compute and non-compute shares within :data:`AGREE` (5 points)
of HTA's, and the overlap fractions within :data:`AGREE` of each other.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import warnings

#: The largest difference, as a fraction of a rank's kernel span (or of the overlap
#: fraction's range, 1), at which HTA and the project's reading agree.
AGREE = 0.05


def available() -> bool:
    """HTA is importable (the ``hta`` extra is installed)."""
    return importlib.util.find_spec("hta") is not None


def cross_check(files: list[str], own: dict) -> dict:
    """HTA's reading of the device traces ``files`` beside ``own`` (rank, as text -> the
    project's ``span_s``, ``compute_s``, ``non_compute_s``, ``idle_s`` and ``comm_overlap`` of
    that rank): ``{"state": "ok", "ranks": {rank: {HTA's seconds, differences of the
    shares}}, "agree": bool}``, or ``{"state": "skipped" |
    "failed", "reason"}`` (HTA not installed, or it could not read the traces)."""
    if not available():
        return {"state": "skipped", "reason": "HTA is not installed (pip install "
                                              "'scalestudy[hta]')"}
    from scalestudy.record.trace import read_trace

    try:
        ranks = {read_trace(f).rank or 0: os.path.abspath(f) for f in files}
        logging.getLogger("hta").setLevel(logging.ERROR)
        with warnings.catch_warnings():  # (its pandas idioms warn; its numbers are what count)
            warnings.simplefilter("ignore")
            from hta.analyzers.breakdown_analysis import BreakdownAnalysis
            from hta.analyzers.communication_analysis import CommunicationAnalysis
            from hta.common.trace import Trace

            # HTA's TraceAnalysis parses ranks in a fork()ed pool: a fork of a process that
            # runs threads (a pytest-xdist worker, a Snakemake job, torch's pools) can hang
            # for ever on a lock a thread held. The ranks are parsed in this process instead.
            trace = Trace(trace_files=ranks)
            trace.load_traces(include_last_profiler_step=True, use_multiprocessing=False)
            temporal = BreakdownAnalysis.get_temporal_breakdown(trace, visualize=False)
            overlap = CommunicationAnalysis.get_comm_comp_overlap(trace, visualize=False)
    except Exception as e:  # HTA's own failures are its verdict on the traces, not ours
        return {"state": "failed", "reason": f"HTA could not read the traces: "
                                             f"{type(e).__name__}: {str(e)[:160]}"}
    out, agree = {}, True
    overlaps = dict(zip(overlap["rank"].tolist(), overlap.iloc[:, -1].tolist()))
    for row in temporal.to_dict("records"):
        rank = int(row["rank"])
        mine = own.get(str(rank)) or {}
        span = row["kernel_time(us)"] * 1e-6
        rec = {"hta_span_s": span, "hta_idle_s": row["idle_time(us)"] * 1e-6,
               "hta_compute_s": row["compute_time(us)"] * 1e-6,
               "hta_non_compute_s": row["non_compute_time(us)"] * 1e-6,
               "hta_comm_overlap": overlaps.get(rank, float("nan")) / 100.0}
        own_span = mine.get("span_s") or float("nan")
        diffs = {k: abs(rec[f"hta_{k}_s"] / span - mine.get(f"{k}_s", float("nan")) / own_span)
                 if span > 0 else float("nan") for k in ("idle", "compute", "non_compute")}
        if mine.get("comm_overlap") is not None:
            diffs["comm_overlap"] = abs(rec["hta_comm_overlap"] - mine["comm_overlap"])
        rec["differences"] = diffs
        rec["agree"] = all(d <= AGREE for d in diffs.values())
        agree = agree and rec["agree"]
        out[str(rank)] = rec
    return {"state": "ok", "ranks": out, "agree": agree, "tolerance": AGREE}
