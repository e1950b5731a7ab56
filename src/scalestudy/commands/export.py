"""``scalestudy export``: the command line of :mod:`scalestudy.report.export.study`."""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.record.reading import RecordError, one_line

TOOLS = ("mlflow", "wandb", "tensorboard")


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 when every tool was exported, 1 when one failed (one line each; the
    others still ran), 2 when the study folder cannot be read."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="scalestudy export", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Copy a finished study into MLflow, Weights & Biases or TensorBoard, as its\n"
                    "export: section says: a run per point (its layout and settings as\n"
                    "parameters, its steps and summary as metrics), the curves per N, the\n"
                    "figures and summary.md. Exporting again updates the same runs, keyed by\n"
                    "point id, and adds only new ones (docs/exporting.md).",
        epilog="example:\n"
               "  scalestudy export results/default --to tensorboard")
    ap.add_argument("study_dir", type=Path, help="the study's results folder (RESULTS/<study>)")
    ap.add_argument("--to", action="append", choices=TOOLS, default=[],
                    help="export to this tool (repeatable; default: those the study's export: "
                         "section names; a tool it leaves out runs with its defaults)")
    a = ap.parse_args(argv)
    from scalestudy.report.export.study import export_study

    try:
        done, failed = export_study(a.study_dir, tuple(dict.fromkeys(a.to)))
    except RecordError as e:
        print(f"scalestudy: error: {one_line(e)}", file=sys.stderr)
        return 2
    for outcome in done:
        print(outcome.line())
    if not done and not failed:
        print("scalestudy export: the study's export: section names no tool (nothing to do)")
    for line in failed:
        print(f"scalestudy: error: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
