"""``scalestudy train``: one rank of a point under torchrun (:mod:`scalestudy.train.loop`).

torchrun starts it as ``-m scalestudy.train POINT_JSON RUN_DIR``: that package's
``__main__`` hands its arguments to this command and ends the rank without the interpreter's
teardown once it returned.
"""

from __future__ import annotations

from pathlib import Path

NAME = "train"
SUMMARY = "train one rank of a point (what torchrun starts on each rank)"
DESCRIPTION = ("Trains the point of POINT_JSON on this rank of the process group torchrun set "
               "up; rank 0 writes steps.jsonl, summary.json and env.json into RUN_DIR. "
               "torchrun starts it as -m scalestudy.train POINT_JSON RUN_DIR.")
#: a rank's exception is the point's evidence (the runner reads the traceback)
TRACEBACK = True
EXAMPLE = "scalestudy train RUN/point.json RUN      (on each rank torchrun starts)"


def add_arguments(p) -> None:
    p.add_argument("point_json", help="the point's point.json")
    p.add_argument("run_dir", help="its run folder")


def run(args) -> int:
    from scalestudy.config.point import Point
    from scalestudy.record.io import read_json
    from scalestudy.train.loop import run as train

    train(Point.from_json(read_json(args.point_json), args.point_json), Path(args.run_dir))
    return 0
