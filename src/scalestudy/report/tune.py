"""The report of a layout search (``scalestudy tune STUDY --measure``) from its record,
``tune/trials.csv`` (``scalestudy.record.trials``, its one reader):

- ``tune/convergence.png|pdf``: the best full-length measured tokens/s per device so far
  against the trial number and against the device-hours spent, every evaluation a marker by
  state, the model-only pick and (when known) the exhaustive search's best as lines;
- ``tune/summary.md``: the "## Tuning" section, which the study's own ``summary.md`` also
  carries (``report.summary``).
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from scalestudy.number_format import fmt
from scalestudy.record.io import clean_temps, refuse_escaping_links, tables_lock, write_text
from scalestudy.record.run_records import read_study
from scalestudy.record.trials import (BEST_STUDY, FAILED_TRIALS, TRIALS, TUNE_DIR, TrialState,
                                      best_complete, read_trials)
from scalestudy.report import style as fstyle

#: States whose evaluation ran nothing (the planner refused the layout, or an earlier trial
#: measured it).
NOT_RUN = (TrialState.REFUSED.value, TrialState.DUPLICATE.value)

#: Per state: colour, marker, filled, legend label (failed runs and refusals are drawn at 0,
#: the value the search was told).
MARKS = {
    TrialState.COMPLETE: (fstyle.PALETTE[0], "o", True, "complete (full length)"),
    TrialState.PROMOTED: (fstyle.PALETTE[2], "^", False, "promoted (shorter run)"),
    TrialState.PRUNED: (fstyle.PALETTE[1], "v", False, "pruned (shorter run)"),
    TrialState.DUPLICATE: ("0.5", "s", False, "duplicate (earlier result, not run)"),
    TrialState.REFUSED: (fstyle.PALETTE[4], "+", True, "refused (not run), told 0"),
    TrialState.OOM: (fstyle.PALETTE[3], "x", True, "oom, told 0"),
    TrialState.TIMEOUT: (fstyle.PALETTE[5], "x", True, "timeout, told 0"),
    TrialState.CRASHED: (fstyle.PALETTE[7], "x", True, "crashed, told 0"),
    TrialState.INVALID: ("0.45", "x", True, "invalid record, told 0"),
    TrialState.SHORT_OF_MEMORY: (fstyle.PALETTE[6], "x", True, "short of memory, told 0"),
}


def _flags(col):
    """A True/False column of trials.csv (``warm_start``, ``reused``) as booleans (text,
    numbers or empty cells as read)."""
    return col.astype(str).str.strip().str.lower().isin(("true", "1", "1.0"))


def _model_pick(trials):
    """``(trial rows, complete row or None)`` of the model-only pick, the first warm-start
    trial; ``(None, None)`` when no trial was a warm start."""
    warm = trials[_flags(trials["warm_start"])]
    if warm.empty:
        return None, None
    rows = trials[trials["trial"] == warm["trial"].min()]
    done = rows[rows["state"] == TrialState.COMPLETE.value]
    return rows, (done.iloc[0] if len(done) else None)


def _exhaustive(exhaustive_best) -> tuple[float, float | None, float | None]:
    """``(value, lo, hi)`` of ``exhaustive_best`` (a number, or ``(value, lo, hi)``)."""
    if isinstance(exhaustive_best, (tuple, list)):
        value, lo, hi = exhaustive_best
        return float(value), float(lo), float(hi)
    return float(exhaustive_best), None, None


def _draw(ax, x, trials, best_x, best_y, x_end, pick, exhaustive, labelled: bool,
          size: float) -> None:
    """One panel: the best-so-far step line at ``(best_x, best_y)`` extended to ``x_end``,
    each evaluation at ``x`` by state (markers of ``size`` pt²), and the reference lines."""
    if len(best_x):
        ax.step(list(best_x) + [x_end], list(best_y) + [best_y[-1]], where="post",
                color=fstyle.PALETTE[0], linewidth=1.5,
                label="best full-length so far" if labelled else None)
    measured = trials["measured_tokens_per_s_per_device"].fillna(0.0)
    for state, (colour, marker, filled, label) in MARKS.items():
        sel = (trials["state"] == state.value).to_numpy()
        if not sel.any():
            continue
        told_zero = state in FAILED_TRIALS or state == TrialState.REFUSED
        y = measured[sel] * 0.0 if told_zero else measured[sel]
        kw = ({"color": colour} if marker in ("x", "+") else
              {"facecolor": colour if filled else "none", "edgecolor": colour})
        ax.scatter(x[sel], y, marker=marker, s=size, linewidth=1.2, zorder=4,
                   label=label if labelled else None, clip_on=False, **kw)
    if pick is not None:
        ax.axhline(pick, color="0.3", linestyle="--", linewidth=1,
                   label="model-only pick" if labelled else None)
    if exhaustive is not None:
        value, lo, hi = exhaustive
        ax.axhline(value, color="black", linestyle=":", linewidth=1.2,
                   label="exhaustive best" if labelled else None)
        if lo is not None:
            ax.axhspan(lo, hi, color="0.6", alpha=0.2, linewidth=0,
                       label="exhaustive best, 95% CI" if labelled else None)


def convergence_figure(trials, out_dir, exhaustive_best=None, style=None) -> list[Path]:
    """Draw ``convergence.png`` and ``convergence.pdf`` under ``out_dir`` (atomically) from
    ``trials`` (trials.csv as ``read_trials`` returns it, rows in the order evaluated): the
    best full-length measured tokens/s per device so far against the trial number (left)
    and against the cumulative device-hours of the runs (right); every evaluation a marker by
    state (shorter runs hollow, failed runs and refusals at 0); a line at the model-only
    pick's measured value and one at ``exhaustive_best`` (tokens/s per device, or
    ``(value, lo, hi)`` with its 95% CI band). ``style``: a ``report.style`` name (default
    ``default``). Returns the two paths."""
    import matplotlib

    matplotlib.use("Agg")

    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    style = fstyle.checked(style or "default")
    out_dir = Path(out_dir)
    trials = trials.reset_index(drop=True)
    value = trials["measured_tokens_per_s_per_device"].where(
        trials["state"] == TrialState.COMPLETE.value)
    per_trial = value.groupby(trials["trial"]).max().sort_index().cummax().ffill().dropna()
    hours = trials["device_hours"].fillna(0.0).cumsum()
    so_far = value.cummax().ffill()
    first = so_far.first_valid_index()
    by_hours = so_far.loc[first:] if first is not None else so_far.iloc[0:0]
    _, pick = _model_pick(trials)
    pick_value = float(pick["measured_tokens_per_s_per_device"]) if pick is not None else None
    exhaustive = _exhaustive(exhaustive_best) if exhaustive_best is not None else None

    sns.set_theme(style="whitegrid", context="paper")  # as the study's own figures
    with fstyle.applied(style):
        w, h = fstyle.STYLES[style]["size"]
        if style == "default":
            fig, (left, right) = plt.subplots(1, 2, figsize=(1.6 * w, h), sharey=True)
        else:
            fig, (left, right) = plt.subplots(1, 2, figsize=(w, h), sharey=True,
                                              layout="constrained")
        size = 36.0 if style == "default" else 18.0
        trial_end = float(trials["trial"].max()) if len(trials) else 1.0
        hours_end = float(hours.iloc[-1]) if len(hours) else 0.0
        _draw(left, trials["trial"].to_numpy(), trials, per_trial.index.to_numpy(),
              per_trial.to_numpy(), trial_end, pick_value, exhaustive, False, size)
        _draw(right, hours.to_numpy(), trials, hours[by_hours.index].to_numpy(),
              by_hours.to_numpy(), hours_end, pick_value, exhaustive, True, size)
        tops = [trials["measured_tokens_per_s_per_device"].max(), pick_value]
        if exhaustive is not None:
            tops += [exhaustive[0], exhaustive[2]]
        top = max((float(t) for t in tops if t is not None and not math.isnan(t)), default=0.0)
        left.set_ylim(0, top * 1.15 if top > 0 else 1.0)
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
        left.set_xlabel("trial")
        right.set_xlim(left=0)
        right.set_xlabel("device-hours spent")
        left.set_ylabel("tokens/s per device (measured)")
        if trials.empty:
            left.text(0.5, 0.5, "no trial yet", ha="center", va="center",
                      transform=left.transAxes)
        fig.suptitle("Layout search: best full-length tokens/s per device so far",
                     fontsize=10 if style == "default" else None)
        fstyle.legend(fig, right, style)
        return fstyle.save(fig, [out_dir / "convergence.png", out_dir / "convergence.pdf"],
                           style)


def _cell(text) -> str:
    """``text`` safe in a Markdown table cell or list item: one line, ``|`` escaped, HTML
    special characters as entities."""
    t = str(text).replace("\r", " ").replace("\n", " ")
    return html.escape(t, quote=False).replace("|", "\\|")


def _rate(x) -> str:
    """Tokens/s as text: whole from 1000 up, else 4 significant digits; ``–`` when missing."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return fmt(v, ".0f" if abs(v) >= 1000 else ".4g")


def tune_markdown(trials, study_name, best_study_path=None) -> str:
    """The "## Tuning" Markdown section of a layout search from ``trials`` (trials.csv as
    ``read_trials`` returns it): the budget spent (layouts measured, runs, device-hours,
    runs reused from earlier records), the best full-length layout with its measured and
    predicted tokens/s per device, the model-only pick (the first warm-start trial) and the
    ratio best / model pick, the evaluations per state, and the completed trials best first.
    ``best_study_path``: where the best layout is written as a study (named as given)."""
    ran = trials[~trials["state"].isin(NOT_RUN)]
    reused = int(_flags(ran["reused"]).sum())
    hours = float(trials["device_hours"].fillna(0.0).sum())
    out = ["## Tuning", "",
           f"Layout search of `{_cell(study_name)}` (`scalestudy tune --measure`): "
           f"{trials['trial'].nunique()} trials, {ran['layout'].nunique()} layouts measured in "
           f"{len(ran)} runs ({reused} reused from earlier records), {hours:.3g} device-hours.",
           ""]
    best = best_complete(trials)
    if best is None:
        out.append("- Best layout: none; no trial completed at full length.")
    else:
        out.append(f"- Best layout: `{_cell(best['layout'])}` (trial {int(best['trial'])}, "
                   f"dp {fmt(best['dp'], 'g')}): "
                   f"{_rate(best['measured_tokens_per_s_per_device'])} tokens/s per device "
                   f"measured, {_rate(best['predicted_tokens_per_s_per_device'])} predicted.")
    rows, pick = _model_pick(trials)
    if pick is not None:
        m = float(pick["measured_tokens_per_s_per_device"])
        ratio = (float(best["measured_tokens_per_s_per_device"]) / m) if m > 0 else math.nan
        out.append(f"- Model-only pick (trial {int(pick['trial'])}, the first warm start): "
                   f"`{_cell(pick['layout'])}`: {_rate(m)} tokens/s per device measured, "
                   f"{_rate(pick['predicted_tokens_per_s_per_device'])} predicted; "
                   f"best / model pick = {fmt(ratio, '.3f')}.")
    elif rows is not None:
        last = rows.iloc[-1]
        out.append(f"- Model-only pick (trial {int(last['trial'])}, the first warm start): "
                   f"`{_cell(last['layout'])}`: {last['state']}, no full-length measurement.")
    if best_study_path is not None:
        out.append(f"- The best layout as a study to run: `{_cell(best_study_path)}`.")
    counts = trials["state"].value_counts()
    states = ", ".join(f"{s.value} {int(counts[s.value])}" for s in TrialState
                       if s.value in counts)
    out.append(f"- Evaluations per state: {states or 'none'}.")
    done = trials[trials["state"] == TrialState.COMPLETE.value]
    if len(done):
        done = done.sort_values(["measured_tokens_per_s_per_device", "trial"],
                                ascending=[False, True], kind="stable")
        out += ["", "| # | trial | layout | measured tokens/s/device | predicted tokens/s/device "
                "| peak memory GB |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(done.to_dict("records"), 1):
            out.append(f"| {i} | {int(r['trial'])} | `{_cell(r['layout'])}` | "
                       f"{_rate(r['measured_tokens_per_s_per_device'])} | "
                       f"{_rate(r['predicted_tokens_per_s_per_device'])} | "
                       f"{fmt(r['peak_memory_gb'])} |")
    return "\n".join(out) + "\n"


def write_tune_report(study_dir, exhaustive_best=None) -> list[Path]:
    """Read ``study_dir/tune/trials.csv`` (``read_trials``) and write ``tune/convergence.png``,
    ``tune/convergence.pdf`` (in the study's ``report.figure_style``) and ``tune/summary.md``
    (the "## Tuning" section), each atomically, holding the study's tables lock; returns the
    paths. ``exhaustive_best``: as in :func:`convergence_figure`. A damaged trials.csv is a
    one-line RecordError; a missing one a FileNotFoundError saying what to run."""
    study_dir = Path(study_dir)
    path = study_dir / TRIALS
    trials = read_trials(path)
    if trials is None:
        raise FileNotFoundError(f"{path} not found: run `scalestudy tune STUDY --measure` first")
    study = read_study(study_dir) or {}
    style = str((study.get("report") or {}).get("figure_style") or "default")
    best = "best.yaml" if (study_dir / BEST_STUDY).exists() else None
    refuse_escaping_links(study_dir)  # a tune/ linked elsewhere is not written through
    out_dir = study_dir / TUNE_DIR
    with tables_lock(study_dir):  # one writer of the study's tables and figures at a time
        clean_temps(out_dir, ("convergence", "summary"))  # a killed report's leftovers
        paths = convergence_figure(trials, out_dir, exhaustive_best, style)
        text = tune_markdown(trials, study.get("name") or study_dir.name, best)
        paths.append(write_text(out_dir / "summary.md", text))
    return paths
