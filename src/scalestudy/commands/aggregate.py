"""``scalestudy aggregate``: a study's run records -> its tables (:mod:`scalestudy.report.aggregate`)."""

from __future__ import annotations

from pathlib import Path

NAME = "aggregate"
SUMMARY = "write the tables of a study's runs again"
DESCRIPTION = ("Reads every run record of RESULTS/<study> and writes runs.csv, runs.parquet, "
               "efficiency.csv, summary.md and summary.tex.")
EXAMPLE = "scalestudy aggregate results/default"


def add_arguments(p) -> None:
    p.add_argument("study_dir", type=Path, help="the study's results folder (RESULTS/<study>)")
    p.add_argument("--detect-warmup", action="store_true",
                   help="also drop a slow start the declared warm-up missed")


def run(args) -> int:
    from scalestudy.report.aggregate import aggregate_study

    aggregate_study(args.study_dir, args.detect_warmup)
    return 0
