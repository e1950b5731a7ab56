"""``scalestudy export``: the command line of :mod:`scalestudy.report.export.study`."""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "export"
SUMMARY = "copy a study into MLflow, W&B or TensorBoard"
DESCRIPTION = ("As its export: section says: a run per point (its layout and settings as "
               "parameters, its steps and summary as metrics), the curves per N, the figures "
               "and summary.md. Exporting again updates the same runs, keyed by point id, and "
               "adds only new ones (docs/exporting.md). Exit status 0 when every tool was "
               "exported, 1 when one failed (one line each; the others still ran), 2 when the "
               "study folder cannot be read.")
EXAMPLE = "scalestudy export results/default --to tensorboard"
TOOLS = ("mlflow", "wandb", "tensorboard")


def add_arguments(p) -> None:
    p.add_argument("study_dir", type=Path, help="the study's results folder (RESULTS/<study>)")
    p.add_argument("--to", action="append", choices=TOOLS, default=[],
                   help="export to this tool (repeatable; default: those the study's export: "
                        "section names; a tool it leaves out runs with its defaults)")


def run(a) -> int:
    from scalestudy.report.export.study import export_study

    done, failed = export_study(a.study_dir, tuple(dict.fromkeys(a.to)))
    for outcome in done:
        print(outcome.line())
    if not done and not failed:
        print("scalestudy export: the study's export: section names no tool (nothing to do)")
    for line in failed:
        print(f"scalestudy: error: {line}", file=sys.stderr)
    return 1 if failed else 0
