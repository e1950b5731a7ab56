"""``python -m scalestudy.commands.compare``: the command line of :mod:`scalestudy.report.compare`."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.record.reading import RecordError, one_line
from scalestudy.report.compare import CompareError, compare


def main(argv: list[str] | None = None) -> int:
    import argparse

    from scalestudy.config.vocab import FigureStyle

    ap = argparse.ArgumentParser(
        prog="scalestudy compare", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The same series of several studies on one set of axes, with per-point ratios\n"
                    "and their 95% confidence intervals (compare.csv, compare.md, figures). The\n"
                    "first study is the baseline; series whose definitions differ are refused.",
        epilog="example:\n"
               "  scalestudy compare results-a/default results-b/default --out cmp")
    ap.add_argument("studies", nargs="+", type=Path,
                    help="results folders of the studies (results/<study>); the first is the baseline")
    ap.add_argument("--out", type=Path, required=True, help="folder for compare.csv/.md and figures")
    ap.add_argument("--style", choices=[str(s) for s in FigureStyle], default="default",
                    help="figure width and fonts (default: screen size)")
    a = ap.parse_args(argv)
    try:
        _, md = compare(a.studies, a.out, a.style)
    except (CompareError, FileNotFoundError, RecordError) as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    print(md, end="")
    print(f"-> {a.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
