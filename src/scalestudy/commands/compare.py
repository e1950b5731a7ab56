"""``scalestudy compare``: several studies on one set of axes (:mod:`scalestudy.report.compare`)."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.config.vocab import FigureStyle

NAME = "compare"
SUMMARY = "draw several studies on one set of axes"
DESCRIPTION = ("The same series of several studies with per-point ratios and their 95% "
               "confidence intervals (compare.csv, compare.md, figures). The first study is the "
               "baseline; series whose definitions differ are refused.")
EXAMPLE = "scalestudy compare results-a/default results-b/default --out cmp"


def add_arguments(p) -> None:
    p.add_argument("studies", nargs="+", type=Path,
                   help="results folders of the studies (results/<study>); the first is the "
                        "baseline")
    p.add_argument("--out", type=Path, required=True, help="folder for compare.csv/.md and figures")
    p.add_argument("--style", choices=[str(s) for s in FigureStyle], default="default",
                   help="figure width and fonts (default: screen size)")


def run(a) -> int:
    from scalestudy.record.bounded_read import one_line
    from scalestudy.report.compare import CompareError, compare

    try:
        _, md = compare(a.studies, a.out, a.style)
    except (CompareError, FileNotFoundError) as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(md, end="")
    print(f"-> {a.out}/")
    return 0
