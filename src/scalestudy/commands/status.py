"""``python -m scalestudy.commands.status``: the command line of :mod:`scalestudy.report.status`."""

from __future__ import annotations

import sys
import time

from scalestudy.record.reading import RecordError, one_line
from scalestudy.report.status import as_json, resolve, snapshot, text


def main(argv: list[str] | None = None) -> int:
    import argparse

    from scalestudy.config.study_yaml import StudyError

    ap = argparse.ArgumentParser(
        prog="scalestudy status", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="How far a study is, which points failed and why, and how long is left.\n"
                    "Reads only the run records, so it works from another terminal while the\n"
                    "study runs, locally or on a Slurm login node.",
        epilog="examples:\n"
               "  scalestudy status workflow/config/default.yaml --watch\n"
               "  scalestudy status results/default --json")
    ap.add_argument("target", nargs="?", default=None,
                    help="study file or its results folder (default: the default study)")
    ap.add_argument("--results", default="results", help="results root for a study file")
    ap.add_argument("--json", action="store_true", help="machine-readable status")
    ap.add_argument("--watch", nargs="?", type=float, const=5.0, default=None, metavar="S",
                    help="refresh every S seconds (default 5) until nothing is running or "
                         "pending, --max-updates is reached or Ctrl-C")
    ap.add_argument("--max-updates", type=int, default=2000,
                    help="with --watch: stop after this many refreshes (default 2000)")
    a = ap.parse_args(argv)
    try:
        study_dir, study = resolve(a.target, a.results)
    except StudyError as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    cache: dict = {}
    tty = sys.stdout.isatty()
    try:
        for i in range(max(1, a.max_updates) if a.watch else 1):
            try:
                st = snapshot(study_dir, study, _cache=cache)
            except RecordError as e:
                print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
                return 2
            body = as_json(st) if a.json else text(st)
            if a.watch and tty and not a.json:
                body = "\033[H\033[2J" + body  # redraw in place
            sys.stdout.write(body)
            sys.stdout.flush()
            if not a.watch or st.done:
                break
            if i + 1 < a.max_updates:
                time.sleep(max(0.2, a.watch))
                if not tty and not a.json:
                    sys.stdout.write("\n")
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
