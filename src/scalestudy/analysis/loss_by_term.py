"""Where each point's step went and the efficiency lost term by term, measured
(``breakdown.csv``, ``efficiency_loss.csv``, written by ``scalestudy aggregate``) and as the
performance model has it (``predict/breakdown_predicted.csv``,
``predict/efficiency_loss_predicted.csv``, written by ``scalestudy predict``).

**Measured.** A run's traced terms (``runs/<id>/breakdown.json``: each rank's profiled
steps, whole, the profiler's cost per recorded event already taken out where it was paid,
the wait for a core its own term: ``scalestudy.record.trace_terms``) in traced seconds;
the timed step T's difference from the traced step S is what the trace cannot attribute,
added to ``unattributed_s`` (:func:`with_residual`: no term is scaled, so no time moves
between terms and the work is never scaled up). ``traced_step_s`` is S,
``traced_raw_step_s`` the traced step before the profiler's cost was taken out,
``profiler_dilation`` the raw traced step over T; a row whose S and T differ by more than
:data:`TRACE_TIMED_TOLERANCE` says so in its note. A (series, N) with repeats: the mean of
its runs' traced terms against the step time of ``efficiency.csv``. Beside the terms: the
straggler (:func:`straggler_columns`) and, on a GPU trace, HTA's temporal breakdown per rank
(:func:`hta_columns`).

**Predicted.** The model's terms of the same point (:func:`model_terms` of a
``study_predictions.csv`` row, the prediction job's), the terms a trace alone has
(``data_s``, ``unattributed_s``) zero; the model's core sharing on a CPU host is its
``core_wait_s``. This module only reads such rows: it runs no model.

**Lost.** Per series and N, ``analysis.efficiency.efficiency_loss`` of the measured terms
against the series' baseline N₀ (they add up to 1 − E(N) of ``efficiency.csv``), and, by the
same :func:`loss_table`, of the predicted terms (1 − the model's E).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalestudy.analysis.efficiency import efficiency_loss
from scalestudy.record import trace_terms as rbreakdown
from scalestudy.record.terms import MEASURED_TERMS, OVERLAPPED_TERMS, STEP_TERMS, TERM_LABELS

#: Columns of ``breakdown.csv`` (one row per series, N and term).
BREAKDOWN_COLUMNS = [
    "series", "mode", "model", "n", "dp", "tp", "pp", "cp", "term", "label", "in_step",
    "measured_s", "measured_min_s", "measured_max_s", "measured_share", "step_time_s",
    "traced_step_s", "traced_raw_step_s", "profiler_removed_s", "profiler_dilation",
    "rank_waited_least", "straggler_rank", "straggler_by", "straggler_delay_s", "slowed_term",
    "timed_straggler_rank", "hta_vs_own", "n_profiled", "note"]
#: Where ``scalestudy predict`` writes the model's side, relative to the study's results folder.
PREDICTED_BREAKDOWN_CSV = Path("predict") / "breakdown_predicted.csv"
PREDICTED_LOSS_CSV = Path("predict") / "efficiency_loss_predicted.csv"
#: The largest relative difference between the traced step (the profiler's cost taken out)
#: and the timed one that is not worth a note: the run-to-run noise of a shared 2-core host
#: (``make bench``'s repeat noise, 1.1-1.3x).
TRACE_TIMED_TOLERANCE = 0.3
#: Columns of ``efficiency_loss.csv`` (one row per series, N > N₀ and term).
LOSS_COLUMNS = ["series", "mode", "n", "baseline_n", "efficiency", "term", "label",
                "measured_loss"]
#: Columns of ``predict/breakdown_predicted.csv`` (one row per series, N and term).
PREDICTED_BREAKDOWN_COLUMNS = ["series", "mode", "n", "term", "label", "in_step", "predicted_s",
                               "predicted_share", "predicted_step_s"]
#: Columns of ``predict/efficiency_loss_predicted.csv`` (one row per series, N > N₀ and term).
PREDICTED_LOSS_COLUMNS = ["series", "mode", "n", "baseline_n", "predicted_efficiency", "term",
                          "label", "predicted_loss"]


def set_against_timed(rec: dict, step_s: float) -> tuple[float, str]:
    """``(traced/timed, note)`` of a run's ``breakdown.json`` against its timed step
    ``step_s``: the traced step after the profiler's cost was taken out over the timed one,
    and a note where they disagree by more than :data:`TRACE_TIMED_TOLERANCE`."""
    ratio = rec["step_s"] / step_s
    note = ""
    if abs(ratio - 1) > TRACE_TIMED_TOLERANCE:
        note = (f"the traced step ({rec['step_s'] * 1e3:.3g} ms, profiler's cost taken out) "
                f"is {ratio:.2f}x the timed one ({step_s * 1e3:.3g} ms): the difference is "
                "in unattributed_s")
    return ratio, note


def model_terms(row: dict) -> dict[str, float]:
    """The model's terms of one ``study_predictions.csv`` row (seconds per step): its step
    terms, a trace's own terms (``data_s``, ``unattributed_s``) zero, and the data-parallel
    traffic hidden behind compute (``dp_comm_s`` − ``dp_comm_exposed_s``)."""
    terms = {k: float(row[k]) for k in STEP_TERMS}
    terms.update(data_s=0.0, unattributed_s=0.0)
    terms["dp_comm_overlapped_s"] = max(0.0, float(row["dp_comm_s"])
                                        - float(row["dp_comm_exposed_s"]))
    return terms


def predicted_tables(pred: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(breakdown_predicted.csv rows, efficiency_loss_predicted.csv rows)`` of a
    ``study_predictions.csv`` frame (one row per configuration: ``series``, ``mode``, ``n``,
    ``baseline_n`` and the model's terms, seconds per step); empty tables for an empty one."""
    if pred.empty:
        return (pd.DataFrame(columns=PREDICTED_BREAKDOWN_COLUMNS),
                pd.DataFrame(columns=PREDICTED_LOSS_COLUMNS))
    rows, per_config = [], {}
    for r in pred.to_dict("records"):
        key = (r["series"], int(r["n"]))
        if key in per_config:
            continue
        terms = per_config[key] = model_terms(r)
        step = sum(terms[k] for k in MEASURED_TERMS)
        for term in MEASURED_TERMS + OVERLAPPED_TERMS:
            in_step = term in MEASURED_TERMS
            p = terms.get(term, float("nan"))
            rows.append({"series": r["series"], "mode": r["mode"], "n": key[1], "term": term,
                         "label": TERM_LABELS.get(term, term), "in_step": in_step,
                         "predicted_s": p,
                         "predicted_share": p / step if in_step and step > 0 else float("nan"),
                         "predicted_step_s": step})
    return (pd.DataFrame(rows, columns=PREDICTED_BREAKDOWN_COLUMNS),
            loss_table(pred, per_config, side="predicted"))


def run_terms(run_dir: Path, step_s: float) -> tuple[dict | None, str]:
    """A run's traced breakdown set against its timed step ``step_s`` (module doc): its
    terms in traced seconds (the profiler's cost already out), the timed step's difference
    from the traced one added to ``unattributed_s``; ``({terms, min, max, dilation, ratio,
    traced, raw, removed, least, straggler, hta, note}, "")``, or ``(None, reason)``."""
    rec, why = rbreakdown.read_breakdown(run_dir)
    if rec is None or not (isinstance(step_s, float) and step_s > 0):
        return None, why or "no step time"
    ratio, note = set_against_timed(rec, step_s)
    hta, hta_note = hta_columns(rec)
    notes = [note, hta_note] + ([f"transfers named by their kernel only (no launcher in the "
                                 f"trace): {', '.join(rec['named_by_kernel'])[:120]}"]
                                if rec.get("named_by_kernel") else [])
    return {"terms": with_residual(rec["terms"], step_s),
            "min": dict(rec["terms_min"]), "max": dict(rec["terms_max"]),
            "dilation": rec.get("raw_step_s", rec["step_s"]) / step_s, "ratio": ratio,
            "traced": rec["step_s"], "raw": rec.get("raw_step_s", rec["step_s"]),
            "removed": rec.get("profiler_s", 0.0), "least": rec["rank_waited_least"],
            "straggler": rec.get("straggler"), "hta": hta,
            "note": "; ".join(filter(None, notes))}, ""


def with_residual(terms: dict[str, float], step_s: float) -> dict[str, float]:
    """Traced terms (seconds) against a timed step ``step_s``: every term as traced, and the
    timed step's difference from their sum (the traced step) added to ``unattributed_s``,
    which the trace cannot attribute: negative where the traced step was the longer (the
    row's note says so beyond :data:`TRACE_TIMED_TOLERANCE`). No term is scaled."""
    out = dict(terms)
    out["unattributed_s"] = out.get("unattributed_s", 0.0) + step_s - sum(
        terms[k] for k in MEASURED_TERMS)
    return out


def hta_columns(rec: dict) -> tuple[str, str]:
    """HTA's temporal breakdown beside the project's, per rank (``breakdown.json``'s
    ``hta``): ``("r0 compute 0.61/0.60 comm 0.30/0.31 idle 0.09/0.09; ...", note)``, shares
    of the kernels' span (HTA's / the project's); the note where they differ beyond
    ``record.hta.AGREE``; ``("", "")`` without an HTA reading (a CPU trace)."""
    h = rec.get("hta") or {}
    if h.get("state") != "ok":
        return "", (f"HTA: {h['reason']}" if h.get("state") == "failed" else "")
    own = rec.get("temporal") or {}
    parts, worst = [], 0.0
    for rank, x in sorted(h["ranks"].items(), key=lambda kv: str(kv[0]).zfill(9)):
        mine, span = own.get(rank) or {}, x["hta_span_s"]
        if not (span and mine.get("span_s")):
            continue
        cells = []
        for label, k in (("compute", "compute"), ("comm", "non_compute"), ("idle", "idle")):
            theirs, ours = x[f"hta_{k}_s"] / span, mine[f"{k}_s"] / mine["span_s"]
            worst = max(worst, abs(theirs - ours))
            cells.append(f"{label} {theirs:.2f}/{ours:.2f}")
        parts.append(f"r{rank} " + " ".join(cells))
    note = (f"HTA disagrees: its temporal breakdown differs by {worst:.2f} of the kernels' "
            f"span (> {h['tolerance']:g})" if not h.get("agree") else "")
    return "; ".join(parts), note


def _run_records(runs: pd.DataFrame, study_dir: Path) -> dict:
    """Per ok run (point id): :func:`run_terms`, or ``{"reason"}`` when it has none."""
    ok = runs[runs["status"] == "ok"]
    out = {}
    for pid, t in zip(ok["point_id"], ok["step_time_median_s"]):
        rec, why = run_terms(study_dir / "runs" / str(pid), t)
        out[pid] = rec if rec is not None else {"reason": why}
    return out


def _mean_terms(recs: list[dict], step_s: float) -> dict[str, float]:
    """The mean of repeats' traced terms (seconds), against the point's timed step
    (:func:`with_residual`)."""
    keys = MEASURED_TERMS + OVERLAPPED_TERMS
    return with_residual({k: sum(r["terms"][k] for r in recs) / len(recs) for k in keys},
                         step_s)


def breakdown_tables(study_dir: Path, runs: pd.DataFrame, efficiency: pd.DataFrame
                     ) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(breakdown.csv rows, efficiency_loss.csv rows, messages)`` of a study, measured
    (module doc); ``runs`` and ``efficiency``: its ``runs.csv`` and ``efficiency.csv``
    frames."""
    study_dir = Path(study_dir)
    per_run = _run_records(runs, study_dir)
    rows, per_config, messages = [], {}, []
    for r in efficiency.to_dict("records"):
        key = (r["series"], int(r["n"]))
        mine = runs[(runs["series"] == r["series"]) & (runs["n"] == r["n"])]
        recs = [per_run[p] for p in mine["point_id"] if "terms" in per_run.get(p, {})]
        reasons = sorted({per_run[p]["reason"] for p in mine["point_id"]
                          if "reason" in per_run.get(p, {})})
        t = r["step_time_s"]
        measured = None
        if recs and isinstance(t, float) and math.isfinite(t):
            measured = _mean_terms(recs, t)
        per_config[key] = measured
        first = recs[0] if recs else {}
        late = straggler_columns(first.get("straggler"), mine)
        note = "; ".join(filter(None, [first.get("note", "")] + ([] if measured else reasons)))
        for term in MEASURED_TERMS + OVERLAPPED_TERMS:
            in_step = term in MEASURED_TERMS
            m = measured[term] if measured else float("nan")
            rows.append({
                "series": r["series"], "mode": r["mode"], "model": r["model"], "n": int(r["n"]),
                "dp": r["dp"], "tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "term": term,
                "label": TERM_LABELS.get(term, term), "in_step": in_step, "measured_s": m,
                "measured_min_s": (min(x["min"][term] for x in recs) if measured else
                                   float("nan")),
                "measured_max_s": (max(x["max"][term] for x in recs) if measured else
                                   float("nan")),
                "measured_share": m / t if (measured and in_step) else float("nan"),
                "step_time_s": t,
                "traced_step_s": _mean(recs, "traced"), "traced_raw_step_s": _mean(recs, "raw"),
                "profiler_removed_s": _mean(recs, "removed"),
                "profiler_dilation": _mean(recs, "dilation"),
                "rank_waited_least": first.get("least"), **late,
                "hta_vs_own": first.get("hta", ""), "n_profiled": len(recs), "note": note})
    if not any(per_config.values()):
        messages.append("no measured breakdown: " + "; ".join(sorted(
            {x["reason"] for x in per_run.values() if "reason" in x}))[:300]
            if per_run else "no measured breakdown: no run ran")
    return (pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS),
            loss_table(efficiency, per_config), messages)


def _mean(recs: list[dict], key: str) -> float:
    return sum(x[key] for x in recs) / len(recs) if recs else float("nan")


def straggler_columns(trace: dict | None, runs: pd.DataFrame) -> dict:
    """The straggler columns of a point: the trace's reading (``breakdown.json``'s
    ``straggler``: ``record.stragglers.trace_straggler``) fills ``straggler_rank``; the timed
    detector's rank (``runs.csv``, only where it flagged the run) stands beside it and fills
    ``straggler_rank`` where the trace names none; no rank where neither flags."""
    timed = None
    if {"straggler", "straggler_rank"} <= set(runs.columns):
        flagged = runs[runs["straggler"].astype("boolean").fillna(False).astype(bool)]
        ranks = flagged["straggler_rank"].dropna()
        timed = int(ranks.iloc[0]) if len(ranks) else None
    out = {"timed_straggler_rank": timed, "straggler_rank": None, "straggler_by": "",
           "straggler_delay_s": float("nan"), "slowed_term": None}
    if trace:
        out.update(straggler_rank=int(trace["rank"]), straggler_by="trace",
                   straggler_delay_s=float(trace["delay_s"]), slowed_term=trace["slowed_term"])
    elif timed is not None:
        out.update(straggler_rank=timed, straggler_by="timed steps")
    return out


def loss_table(frame: pd.DataFrame, per_config: dict, side: str = "measured") -> pd.DataFrame:
    """Per series and N > N₀ each term's efficiency lost against N₀ (module doc);
    ``per_config``: ``(series, n) -> terms`` (seconds per step, None where there are none).
    ``side="measured"``: ``efficiency_loss.csv`` rows of an ``efficiency.csv`` frame (its
    ``efficiency`` beside the losses); ``side="predicted"``: ``efficiency_loss_predicted.csv``
    rows of a ``study_predictions.csv`` frame (``predicted_efficiency`` = 1 − the model's
    losses)."""
    rows = []
    for series, g in frame.groupby("series", sort=False):
        base = g["baseline_n"].dropna()
        if base.empty:
            continue
        n0 = int(base.iloc[0])
        t0 = per_config.get((series, n0))
        mode = str(g["mode"].iloc[0])
        for r in g.drop_duplicates("n").sort_values("n").to_dict("records"):
            n = int(r["n"])
            if n == n0:
                continue
            t = per_config.get((series, n))
            lost = efficiency_loss(mode, _step(t), _step(t0), n, n0) if t and t0 else {}
            head = {"series": series, "mode": mode, "n": n, "baseline_n": n0}
            if side == "measured":
                head["efficiency"] = r["efficiency"]
            else:
                head["predicted_efficiency"] = 1 - sum(lost.values()) if lost else float("nan")
            for term in MEASURED_TERMS:
                rows.append({**head, "term": term, "label": TERM_LABELS.get(term, term),
                             f"{side}_loss": lost.get(term, float("nan"))})
    return pd.DataFrame(rows, columns=LOSS_COLUMNS if side == "measured"
                        else PREDICTED_LOSS_COLUMNS)


def _step(terms: dict | None) -> dict:
    return {k: terms[k] for k in MEASURED_TERMS} if terms else {}


#: Columns of ``predict/terms_vs_measured.csv``.
TERMS_VS_MEASURED_COLUMNS = ["series", "n", "term", "label", "predicted_s", "measured_s",
                             "predicted_over_measured"]


def terms_versus_measured(predicted: pd.DataFrame, breakdown: pd.DataFrame) -> pd.DataFrame:
    """Every step term of every point, the model's beside the trace's: ``predicted`` rows of
    ``perf.tables.breakdown_row`` (a point's terms in seconds, ``series`` and ``n``),
    ``breakdown``: a ``breakdown.csv`` frame. A term neither prices nor measures is left out;
    ``predicted_over_measured`` where the measurement is > 0."""
    measured = breakdown[breakdown["in_step"].astype(bool) & breakdown["measured_s"].notna()]
    have = {(s, int(n), t): m for s, n, t, m in zip(measured["series"], measured["n"],
                                                    measured["term"], measured["measured_s"])}
    rows = []
    for r in predicted.to_dict("records"):
        for term in MEASURED_TERMS:
            m = have.get((r["series"], int(r["n"]), term))
            p = float(r.get(term, 0.0) or 0.0)
            if m is None or (m <= 0 and p <= 0):
                continue
            rows.append({"series": r["series"], "n": int(r["n"]), "term": term,
                         "label": TERM_LABELS[term], "predicted_s": p, "measured_s": m,
                         "predicted_over_measured": p / m if m > 0 else float("nan")})
    return pd.DataFrame(rows, columns=TERMS_VS_MEASURED_COLUMNS)


def term_ratio_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per term of a ``terms_versus_measured`` frame: the points it was compared on, the
    median, lowest and highest predicted / measured, the share of the measured steps."""
    rows = []
    total = df.groupby(["series", "n"])["measured_s"].sum().sum()
    for term, g in df.groupby("term", sort=False):
        r = g["predicted_over_measured"].dropna()
        rows.append({"term": term, "label": TERM_LABELS[term], "points": len(r),
                     "median_ratio": float(r.median()) if len(r) else float("nan"),
                     "min_ratio": float(r.min()) if len(r) else float("nan"),
                     "max_ratio": float(r.max()) if len(r) else float("nan"),
                     "measured_share": float(g["measured_s"].sum() / total) if total else 0.0})
    return pd.DataFrame(rows).sort_values("measured_share", ascending=False, kind="stable")
