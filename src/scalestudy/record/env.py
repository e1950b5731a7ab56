"""What every ``env.json`` holds, whichever workload ran (the built-in trainer writes the rest
of its record from the ranks, the runner for a command workload): the software that ran and
the point's config hash. No torch import."""

from __future__ import annotations

import platform as pyplatform
import sys

from scalestudy.config.point import Point
from scalestudy.paths import git_commit


def common_env(point: Point) -> dict:
    """``git_commit``, ``python``, ``platform`` and ``config_hash`` of an ``env.json``."""
    return {"git_commit": git_commit(), "python": sys.version.split()[0],
            "platform": pyplatform.platform(), "config_hash": point.config_hash}
