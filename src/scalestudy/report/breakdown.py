"""Where the efficiency went, for a reader: one sentence per series (``summary.md``, the
report's front page) from ``efficiency_loss.csv`` (``scalestudy.analysis.loss_by_term``), the
model's losses beside it where ``scalestudy predict`` wrote them
(``predict/efficiency_loss_predicted.csv``), and the points whose trace disagrees with its
cross-checks (the timed step, HTA); its figure is ``report.plots.breakdown_figure``."""

from __future__ import annotations

import math

from pathlib import Path

import pandas as pd

from scalestudy.analysis.loss_by_term import PREDICTED_BREAKDOWN_CSV, PREDICTED_LOSS_CSV
from scalestudy.record.terms import TERM_LABELS

#: Terms named in a sentence: the largest losses, until they explain this share of the loss.
EXPLAINED = 0.8
#: At most this many terms named in a sentence.
MAX_NAMED = 4


def _named(losses: dict[str, float], total: float) -> list[tuple[str, float]]:
    """The largest positive losses, in order, until they explain :data:`EXPLAINED` of
    ``total`` (at most :data:`MAX_NAMED`)."""
    out, covered = [], 0.0
    for term, v in sorted(losses.items(), key=lambda kv: -kv[1]):
        if v <= 0 or len(out) == MAX_NAMED or (out and covered >= EXPLAINED * total):
            break
        out.append((term, v))
        covered += v
    return out


def model_side(study_dir: Path) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """The model's side of a study's breakdown, as ``scalestudy predict`` wrote it:
    ``(predict/breakdown_predicted.csv, predict/efficiency_loss_predicted.csv)`` frames, None
    for a file not (yet) written or unreadable."""
    out = []
    for rel in (PREDICTED_BREAKDOWN_CSV, PREDICTED_LOSS_CSV):
        try:
            out.append(pd.read_csv(Path(study_dir) / rel))
        except (OSError, ValueError):
            out.append(None)
    return out[0], out[1]


def joined(measured: pd.DataFrame, model: pd.DataFrame | None, column: str) -> pd.DataFrame:
    """``measured`` (a ``breakdown.csv`` or ``efficiency_loss.csv`` frame) with the model's
    ``column`` joined on series, N and term; ``measured`` as it is without a model frame."""
    if model is None or column not in model or measured.empty:
        return measured
    keys = ["series", "n", "term"]
    return measured.merge(model[keys + [column]].drop_duplicates(keys), on=keys, how="left")


def loss_sentences(loss: pd.DataFrame, model_loss: pd.DataFrame | None = None) -> list[dict]:
    """Per series with a measured breakdown, at its largest N: ``{series, n, text}``, the
    efficiency lost against N₀ and the terms it went to, measured, then the model's
    (``model_loss``: an ``efficiency_loss_predicted.csv`` frame; measured only without it)."""
    out = []
    if loss.empty:
        return out
    loss = joined(loss, model_loss, "predicted_loss")
    for series, g in loss.groupby("series", sort=False):
        g = g[g["measured_loss"].notna()]
        if g.empty:
            continue
        n = int(g["n"].max())
        at = g[g["n"] == n]
        measured = dict(zip(at["term"], at["measured_loss"]))
        lost = sum(measured.values())
        n0 = int(at["baseline_n"].iloc[0])
        parts = [f"{v:.2f} {TERM_LABELS[t]}" for t, v in _named(measured, lost)]
        rest = lost - sum(v for _, v in _named(measured, lost))
        if abs(rest) >= 0.005:
            parts.append(f"{rest:.2f} elsewhere" if rest > 0 else f"{-rest:.2f} regained "
                                                                 "elsewhere")
        text = (f"{series} at N={n} (vs N₀={n0}): {lost:.2f} of the efficiency lost"
                + (": " + ", ".join(parts) if parts and lost > 0 else ""))
        predicted = (dict(zip(at["term"], at["predicted_loss"])) if "predicted_loss" in at
                     else {})
        if predicted and all(isinstance(v, float) and math.isfinite(v) for v in predicted.values()):
            plost = sum(predicted.values())
            top = _named(predicted, plost)
            text += (f"; the model: {plost:.2f} lost"
                     + (f", {top[0][1]:.2f} of it {TERM_LABELS[top[0][0]]}" if top else ""))
        out.append({"series": series, "n": n, "text": text + "."})
    return out


def markdown(loss: pd.DataFrame, breakdown: pd.DataFrame,
             model_loss: pd.DataFrame | None = None) -> list[str]:
    """The ``summary.md`` section (its lines; none without a measured breakdown), the model's
    losses (``model_loss``) beside the measured ones where given."""
    sentences = loss_sentences(loss, model_loss)
    if not sentences:
        return []
    lines = ["", "## Where the efficiency went", ""]
    lines += [f"- {s['text']}" for s in sentences]
    points = breakdown.drop_duplicates(["series", "n"])
    removed = (points["profiler_removed_s"] / points["traced_raw_step_s"]).dropna() \
        if "profiler_removed_s" in points else pd.Series(dtype=float)
    lines += ["", "Measured from `torch.profiler` traces of a few steps after each point's timed "
              "window (breakdown.csv: each term's seconds per step; "
              "efficiency_loss.csv: the efficiency lost term by term, adding up to 1 − E; the "
              "model's, where it was run: predict/breakdown_predicted.csv, "
              "predict/efficiency_loss_predicted.csv). "
              "Lost to term i at N: weak (tᵢ(N) − tᵢ(N₀)) / T(N), strong "
              "(tᵢ(N) − tᵢ(N₀)·N₀/N) / T(N)."
              + (f" The profiler's cost, measured per recorded event on each rank, was taken "
                 f"out where it was paid: {removed.min():.0%}–{removed.max():.0%} of the "
                 "traced steps (docs/breakdown.md)." if len(removed) else "")]
    lines += _disagreements(points)
    return lines


def _disagreements(points: pd.DataFrame) -> list[str]:
    """Lines on the points whose traced step is far from the timed one, or whose device
    trace HTA reads otherwise (their rows' notes)."""
    if "note" not in points:
        return []
    out = []
    for r in points.to_dict("records"):
        for part in str(r.get("note") or "").split("; "):
            if part.startswith(("HTA disagrees", "the traced step")):
                out.append(f"- {r['series']} N={int(r['n'])}: {part}")
    return ["", "Where the trace and its cross-checks disagree:", ""] + out if out else []
