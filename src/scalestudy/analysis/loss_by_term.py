"""Where each point's step went, measured and predicted, and the efficiency lost term by term
(``breakdown.csv``, ``efficiency_loss.csv``).

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

**Predicted.** The performance model's terms of the same point (``perf.stepmodel``, on the
study's own model inputs: ``perf.inputs``), the terms a trace alone has (``data_s``,
``unattributed_s``) zero; the model's core sharing on a CPU host is its ``core_wait_s``.

**Lost.** Per series and N, ``analysis.efficiency.efficiency_loss`` of the measured terms
against the series' baseline N₀ (they add up to 1 − E(N) of ``efficiency.csv``), and of the
predicted terms (1 − the model's E).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from scalestudy.analysis.efficiency import efficiency_loss
from scalestudy.config.point import Point
from scalestudy.config.checks import PointError
from scalestudy.record import trace_terms as rbreakdown
from scalestudy.record.run_records import read_point
from scalestudy.record.terms import MEASURED_TERMS, OVERLAPPED_TERMS, STEP_TERMS, TERM_LABELS

#: Columns of ``breakdown.csv`` (one row per series, N and term).
BREAKDOWN_COLUMNS = [
    "series", "mode", "model", "n", "dp", "tp", "pp", "cp", "term", "label", "in_step",
    "measured_s", "measured_min_s", "measured_max_s", "measured_share", "predicted_s",
    "predicted_share", "predicted_over_measured", "step_time_s", "predicted_step_s",
    "traced_step_s", "traced_raw_step_s", "profiler_removed_s", "profiler_dilation",
    "rank_waited_least", "straggler_rank", "straggler_by", "straggler_delay_s", "slowed_term",
    "timed_straggler_rank", "hta_vs_own", "n_profiled", "note"]
#: The largest relative difference between the traced step (the profiler's cost taken out)
#: and the timed one that is not worth a note: the run-to-run noise of a shared 2-core host
#: (``make bench``'s repeat noise, 1.1-1.3x).
TRACE_TIMED_TOLERANCE = 0.3
#: Columns of ``efficiency_loss.csv`` (one row per series, N > N₀ and term).
LOSS_COLUMNS = ["series", "mode", "n", "baseline_n", "efficiency", "predicted_efficiency",
                "term", "label", "measured_loss", "predicted_loss"]


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


def predicted_terms(point: Point, hw, measured) -> tuple[dict[str, float] | None, str]:
    """The model's terms of ``point`` (seconds per step; a trace's own terms zero), or
    ``(None, reason)``."""
    from scalestudy.perf import stepmodel

    try:
        b = stepmodel.predict_step_time(point, hw, measured)
    except (ValueError, ZeroDivisionError) as e:
        return None, f"not predicted: {e}"
    terms = {k: float(getattr(b, k)) for k in STEP_TERMS}
    terms.update(data_s=0.0, unattributed_s=0.0)
    terms["dp_comm_overlapped_s"] = max(0.0, float(b.dp_comm_s - b.dp_comm_exposed_s))
    return terms, ""


def model_inputs_for(study: dict | None, study_dir: Path):
    """The model's inputs for a study's ``study.json`` object (``perf.inputs.model_inputs``),
    or ``(None, reason)``."""
    from scalestudy.config.studyspec import Study
    from scalestudy.perf.inputs import model_inputs

    if not study:
        return None, "no study.json: nothing to predict with"
    try:
        mi = model_inputs(Study.from_validated(study), study_dir)
    except (ValueError, KeyError, TypeError, OSError) as e:
        return None, f"no model inputs: {str(e).splitlines()[0][:160]}"
    return mi, ""


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


def _points_by_config(runs: pd.DataFrame, study_dir: Path) -> dict:
    """``(series, n) -> Point`` of the first repeat of each configuration with a readable
    ``point.json``."""
    out = {}
    for series, n, pid in zip(runs["series"], runs["n"], runs["point_id"]):
        key = (series, int(n))
        if key in out:
            continue
        doc, _ = read_point(study_dir / "runs" / str(pid))
        try:
            out[key] = Point.from_json(doc) if doc else None
        except PointError:
            out[key] = None
    return out


def breakdown_tables(study_dir: Path, runs: pd.DataFrame, efficiency: pd.DataFrame,
                     study: dict | None) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """``(breakdown.csv rows, efficiency_loss.csv rows, messages)`` of a study (module doc);
    ``runs`` and ``efficiency``: its ``runs.csv`` and ``efficiency.csv`` frames; ``study``: its
    ``study.json`` object."""
    study_dir = Path(study_dir)
    per_run = _run_records(runs, study_dir)
    points = _points_by_config(runs, study_dir)
    mi, why_no_model = model_inputs_for(study, study_dir)
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
        point = points.get(key)
        predicted, why = (predicted_terms(point, mi.hw, mi.measured) if mi and point
                          else (None, why_no_model or "no point.json"))
        per_config[key] = (measured, predicted)
        pstep = sum(predicted[k] for k in MEASURED_TERMS) if predicted else float("nan")
        first = recs[0] if recs else {}
        late = straggler_columns(first.get("straggler"), mine)
        note = "; ".join(filter(None, [first.get("note", "")] + ([] if measured else reasons)
                                + ([] if predicted else [why])))
        for term in MEASURED_TERMS + OVERLAPPED_TERMS:
            in_step = term in MEASURED_TERMS
            m = measured[term] if measured else float("nan")
            p = predicted.get(term, float("nan")) if predicted else float("nan")
            rows.append({
                "series": r["series"], "mode": r["mode"], "model": r["model"], "n": int(r["n"]),
                "dp": r["dp"], "tp": r["tp"], "pp": r["pp"], "cp": r["cp"], "term": term,
                "label": TERM_LABELS.get(term, term), "in_step": in_step, "measured_s": m,
                "measured_min_s": (min(x["min"][term] for x in recs) if measured else
                                   float("nan")),
                "measured_max_s": (max(x["max"][term] for x in recs) if measured else
                                   float("nan")),
                "measured_share": m / t if (measured and in_step) else float("nan"),
                "predicted_s": p,
                "predicted_share": p / pstep if (predicted and in_step) else float("nan"),
                "predicted_over_measured": p / m if (measured and predicted and m > 0)
                else float("nan"),
                "step_time_s": t, "predicted_step_s": pstep,
                "traced_step_s": _mean(recs, "traced"), "traced_raw_step_s": _mean(recs, "raw"),
                "profiler_removed_s": _mean(recs, "removed"),
                "profiler_dilation": _mean(recs, "dilation"),
                "rank_waited_least": first.get("least"), **late,
                "hta_vs_own": first.get("hta", ""), "n_profiled": len(recs), "note": note})
    if not any(m for m, _ in per_config.values()):
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


def loss_table(efficiency: pd.DataFrame, per_config: dict) -> pd.DataFrame:
    """``efficiency_loss.csv`` rows: per series and N > N₀ each term's efficiency lost,
    measured and predicted (module doc); ``per_config``: ``(series, n) -> (measured terms,
    predicted terms)``, seconds per step."""
    rows = []
    for series, g in efficiency.groupby("series", sort=False):
        base = g["baseline_n"].dropna()
        if base.empty:
            continue
        n0 = int(base.iloc[0])
        m0, p0 = per_config.get((series, n0), (None, None))
        mode = str(g["mode"].iloc[0])
        for r in g.sort_values("n").to_dict("records"):
            n = int(r["n"])
            if n == n0:
                continue
            m, p = per_config.get((series, n), (None, None))
            ml = efficiency_loss(mode, _step(m), _step(m0), n, n0) if m and m0 else {}
            pl = efficiency_loss(mode, _step(p), _step(p0), n, n0) if p and p0 else {}
            pe = 1 - sum(pl.values()) if pl else float("nan")
            for term in MEASURED_TERMS:
                rows.append({"series": series, "mode": mode, "n": n, "baseline_n": n0,
                             "efficiency": r["efficiency"], "predicted_efficiency": pe,
                             "term": term, "label": TERM_LABELS.get(term, term),
                             "measured_loss": ml.get(term, float("nan")),
                             "predicted_loss": pl.get(term, float("nan"))})
    return pd.DataFrame(rows, columns=LOSS_COLUMNS)


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
