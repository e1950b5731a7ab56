"""``scalestudy aggregate``'s one step: a study's run records read (``analysis.aggregate``)
and every table written together, all or none: ``runs.csv`` (+ ``runs.parquet``),
``efficiency.csv``, ``breakdown.csv``, ``efficiency_loss.csv``, ``summary.md`` and
``summary.tex``. The one place that writes them."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.analysis.aggregate import collect
from scalestudy.analysis.loss_by_term import breakdown_tables
from scalestudy.record.io import atomic_paths, clean_temps, tables_lock
from scalestudy.record.bounded_read import RecordError, one_line
from scalestudy.record.trials import BEST_STUDY, TRIALS, read_trials
from scalestudy.report.breakdown import model_side
from scalestudy.report.summary import summary_latex, summary_markdown


#: The tables :func:`aggregate_study` writes (file stems, for stale temp files of a killed run).
TABLE_STEMS = ("runs", "efficiency", "breakdown", "efficiency_loss", "summary")


def aggregate_study(study_dir: Path, detect_warmup: bool = False) -> None:
    """Write ``runs.csv``, ``runs.parquet``, ``efficiency.csv``, ``breakdown.csv``,
    ``efficiency_loss.csv``, ``summary.md`` and ``summary.tex`` (all or none, atomically), holding the study's tables lock: a second
    aggregate (or plot) of the study waits for this one. An OSError names the path."""
    study_dir = Path(study_dir)
    with tables_lock(study_dir):
        clean_temps(study_dir, TABLE_STEMS)  # a killed aggregate's leftovers
        runs, efficiency, context = collect(study_dir, detect_warmup)
        try:
            context["trials"] = read_trials(study_dir / TRIALS)
        except RecordError as e:  # a damaged search record: said, the tables written
            context["messages"].append(one_line(e))
        if (study_dir / BEST_STUDY).exists():
            context["best_study"] = str(BEST_STUDY)
        breakdown, loss, messages = breakdown_tables(study_dir, runs, efficiency)
        context.update(breakdown=breakdown, loss=loss,
                       model_loss=model_side(study_dir)[1])
        context["messages"] += messages
        names = ("runs.csv", "runs.parquet", "efficiency.csv", "breakdown.csv",
                 "efficiency_loss.csv", "summary.md", "summary.tex")
        with atomic_paths([study_dir / n for n in names]) as (t_runs, t_parquet, t_eff, t_brk,
                                                               t_loss, t_md, t_tex):
            runs.to_csv(t_runs, index=False, float_format="%.6g")
            try:
                runs.to_parquet(t_parquet, index=False)
            except (TypeError, ValueError, ImportError):  # mixed-type object column: as text
                obj = runs.select_dtypes(include="object").columns
                runs.astype({c: "string" for c in obj}).to_parquet(t_parquet, index=False)
            efficiency.to_csv(t_eff, index=False, float_format="%.6g")
            breakdown.to_csv(t_brk, index=False, float_format="%.6g")
            loss.to_csv(t_loss, index=False, float_format="%.6g")
            t_md.write_text(summary_markdown(runs, efficiency, context))
            t_tex.write_text(summary_latex(runs, efficiency, context))
    for msg in context["messages"]:
        print(msg, file=sys.stderr)
