"""``scalestudy front``: a study's front page (:mod:`scalestudy.report.front`)."""

from __future__ import annotations

from pathlib import Path

NAME = "front"
SUMMARY = "write the report's front page of a study again"
DESCRIPTION = ("Writes RESULTS/<study>/report/front.html: per series the answer in one line, "
               "where the efficiency went, the efficiency figures and the points that did not "
               "run, from the study's tables and figures.")
EXAMPLE = "scalestudy front results/default"


def add_arguments(p) -> None:
    p.add_argument("study_dir", type=Path, help="the study's results folder (RESULTS/<study>)")


def run(args) -> int:
    from scalestudy.report.front import run as write

    print(write(args.study_dir))
    return 0
