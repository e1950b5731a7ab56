"""``scalestudy plot``: a study's figures (:mod:`scalestudy.report.plots`)."""

from __future__ import annotations

from pathlib import Path

from scalestudy.config.vocab import FigureStyle, Reference

NAME = "plot"
SUMMARY = "draw a study's figures again"
DESCRIPTION = ("Draws the efficiency, throughput and MFU figures of RESULTS/<study> into its "
               "figures/ folder (.png, .pdf and the .csv behind each).")
EXAMPLE = "scalestudy plot results/default --style single-column"


def add_arguments(p) -> None:
    p.add_argument("study_dir", type=Path, help="the study's results folder (RESULTS/<study>)")
    p.add_argument("--references", nargs="*", choices=[str(r) for r in Reference], default=None,
                   help="overlay these published results (default: the study's references)")
    p.add_argument("--style", choices=[str(s) for s in FigureStyle], default=None,
                   help="figure width and fonts for a paper (default: the study's "
                        "report.figure_style)")


def run(args) -> int:
    from scalestudy.report.plots import run as draw

    for path in draw(args.study_dir, args.references, args.style):
        print(path)
    return 0
