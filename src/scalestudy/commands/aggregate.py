"""``python -m scalestudy.commands.aggregate``: the command line of :mod:`scalestudy.report.aggregate`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scalestudy.record.io import os_error_line
from scalestudy.record.reading import RecordError, one_line
from scalestudy.report.aggregate import aggregate_study


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scalestudy.commands.aggregate",
                                description="Run records -> runs.csv, efficiency.csv, summary.md")
    p.add_argument("study_dir", type=Path)
    p.add_argument("--detect-warmup", action="store_true",
                   help="also drop a slow start the declared warm-up missed")
    args = p.parse_args(argv)
    try:
        aggregate_study(args.study_dir, args.detect_warmup)
    except RecordError as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, an unwritable folder: one line, the tables as they were
        print(f"scalestudy: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
