"""``python -m scalestudy.commands.plots``: the command line of :mod:`scalestudy.report.plots`."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.record.io import os_error_line
from scalestudy.record.reading import RecordError, one_line
from scalestudy.report import plots as stage
from scalestudy.report import references as refs
from scalestudy.report import style as fstyle
from scalestudy.report.plots import run


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m scalestudy.commands.plots", description=stage.__doc__.split("\n\n")[0])
    p.add_argument("study_dir", type=Path)
    p.add_argument("--references", nargs="*", default=None,
                   help=f"overlay published results ({', '.join(refs.REFERENCES)}); default: the study's")
    p.add_argument("--style", choices=list(fstyle.STYLES), default=None,
                   help="figure size and fonts for a paper; default: the study's "
                        "report.figure_style, else default")
    args = p.parse_args(argv)
    try:
        for path in run(args.study_dir, args.references, args.style):
            print(path)
    except RecordError as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, an unwritable figures/: one line, each figure whole
        print(f"scalestudy: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
