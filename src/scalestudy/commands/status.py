"""``scalestudy status``: how far a study is (:mod:`scalestudy.report.status`)."""

from __future__ import annotations

import sys
import time

NAME = "status"
SUMMARY = "progress of a study: done, failed and why, time left"
DESCRIPTION = ("Reads only the run records, so it works from another terminal while the study "
               "runs, locally or on a Slurm login node.")
EXAMPLE = "scalestudy status workflow/config/default.yaml --watch"


def add_arguments(p) -> None:
    p.add_argument("target", nargs="?", default=None,
                   help="study file or its results folder (default: the default study)")
    p.add_argument("--results", default="results", help="results root for a study file")
    p.add_argument("--json", action="store_true", help="machine-readable status")
    p.add_argument("--watch", nargs="?", type=float, const=5.0, default=None, metavar="S",
                   help="refresh every S seconds (default 5) until nothing is running or "
                        "pending, --max-updates is reached or Ctrl-C")
    p.add_argument("--max-updates", type=int, default=2000,
                   help="with --watch: stop after this many refreshes (default 2000)")


def run(a) -> int:
    from scalestudy.report.status import as_json, resolve, snapshot, text

    study_dir, study = resolve(a.target, a.results)
    cache: dict = {}
    tty = sys.stdout.isatty()
    try:
        for i in range(max(1, a.max_updates) if a.watch else 1):
            st = snapshot(study_dir, study, _cache=cache)
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
