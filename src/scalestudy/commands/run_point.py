"""``scalestudy run-point``: one sweep point, as each training job of the workflow runs it
(:mod:`scalestudy.run.runner`)."""

from __future__ import annotations

import errno
import signal
import sys
from pathlib import Path

NAME = "run-point"
SUMMARY = "run one sweep point (what each Snakemake job runs)"
DESCRIPTION = ("Starts the point's ranks, watches them, classifies the outcome and writes "
               "status.json (ok, oom, timeout, crashed or invalid, with the reason). Exits 0 once "
               "status.json is written, whatever the point did: a failed point is data.")
EXAMPLE = "scalestudy run-point results/default/runs/ID/point.json results/default/runs/ID"


def add_arguments(p) -> None:
    p.add_argument("point_json", help="the point's point.json (written by the plan)")
    p.add_argument("run_dir", help="its run folder, results/<study>/runs/<point id>")
    p.add_argument("--job", action="store_true",
                   help="this process is the workflow job's: it ends with its parent and reaps "
                        "the orphans of its launch (what the Snakemake rule passes)")


def run(args) -> int:
    from scalestudy.run import lifetime
    from scalestudy.run.runner import as_job, cancelled, no_space, run_point

    if args.job:
        as_job()
    signal.signal(signal.SIGTERM, cancelled)
    point_json, run_dir = args.point_json, args.run_dir
    study_dir = Path(run_dir).absolute().parent.parent
    if Path(run_dir).is_symlink() or not Path(run_dir).resolve().is_relative_to(study_dir.resolve()):
        print(f"scalestudy: error: {run_dir} is a symlink leading outside {study_dir}: "
              "nothing written there; remove the link and rerun", file=sys.stderr)
        return 2
    try:
        status = run_point(Path(point_json), Path(run_dir))
    except lifetime.PointBusy as e:
        print(f"scalestudy: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"scalestudy: interrupted: {run_dir} left without a status (it reruns)",
              file=sys.stderr)
        return 130
    except OSError as e:  # not even status.json could be written
        print(f"scalestudy: error: {run_dir}: status.json not written: "
              f"{no_space(run_dir) if e.errno == errno.ENOSPC else e}", file=sys.stderr)
        return 1
    print(f"{Path(run_dir).name}: {status['state']} {status['reason']}".rstrip())
    return 0
