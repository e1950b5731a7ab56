"""A command workload under the launcher: its environment and what ``env.json`` records of
it (the template and its argv: ``scalestudy.config.template``).

The command replaces ``-m scalestudy.train POINT RUN_DIR`` as torchrun's script
(``torchrun ... --no-python ARGV``), so it runs under the same launcher as the built-in
trainer (torchrun on one node, srun + torchrun on several), with the same watchdog, timeouts
and status taxonomy (``scalestudy.run.runner``). Its environment adds
``SCALESTUDY_POINT_DIR`` (the run folder, where ``steps.jsonl`` goes) and
``SCALESTUDY_POINT_JSON``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scalestudy.config.point import Point
from scalestudy.config.template import command_argv
from scalestudy.record.steps import POINT_DIR_ENV

POINT_JSON_ENV = "SCALESTUDY_POINT_JSON"


def command_env(point: Point, point_dir: str | Path) -> dict[str, str]:
    """What a command's environment adds: where its record goes."""
    point_dir = Path(point_dir)
    return {POINT_DIR_ENV: str(point_dir), POINT_JSON_ENV: str(point_dir / "point.json")}


def describe(point: Point, point_dir: str | Path, python: str = sys.executable) -> dict:
    """The workload as ``env.json`` records it: kind, and for a command its template, the
    expanded argv and the working folder."""
    w = point.workload
    if not w.is_command:
        return {"kind": str(w.kind)}
    return {"kind": str(w.kind), "template": list(w.command),
            "argv": command_argv(point, point_dir, python), "cwd": w.cwd,
            "metrics": str(w.metrics), "patterns": dict(w.patterns) or None,
            "flops_per_token": (w.flops_per_token if isinstance(w.flops_per_token, float)
                                else str(w.flops_per_token))}
