"""``python -m scalestudy.commands.front``: the command line of :mod:`scalestudy.report.front`."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.record.io import exit_on_os_error
from scalestudy.report import front as stage
from scalestudy.report.front import run


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m scalestudy.commands.front",
                                 description=stage.__doc__.split("\n")[0])
    ap.add_argument("study_dir", type=Path)
    a = ap.parse_args(argv)
    print(run(a.study_dir))
    return 0


if __name__ == "__main__":  # one line for a failed write, as every results-writing rule
    sys.exit(exit_on_os_error(main))
