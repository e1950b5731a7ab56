"""Where the workflow files are: the Snakefile, rules, schema, study files, profiles and report
captions. In a checkout (or an editable install) they are the repository's ``workflow/``; an
installed wheel carries a copy as package data (``scalestudy/workflow/``, mapped at build
time by ``setup.py``), so ``scalestudy run`` works from any directory."""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def workflow_dir() -> Path:
    """The folder holding ``Snakefile``, ``rules/``, ``schemas/``, ``config/``, ``profiles/``,
    ``report/`` and ``envs/``."""
    for candidate in (_PACKAGE / "workflow", _PACKAGE.parents[1] / "workflow"):
        if (candidate / "Snakefile").is_file():
            return candidate
    raise FileNotFoundError(
        f"scalestudy's workflow files are missing (looked in {_PACKAGE / 'workflow'} and "
        f"{_PACKAGE.parents[1] / 'workflow'}); reinstall the package")


def snakefile() -> Path:
    return workflow_dir() / "Snakefile"


def schema_file() -> Path:
    """The study schema studies are validated against (generated: config.schema_gen)."""
    return workflow_dir() / "schemas" / "study.schema.json"


def profile(name: str) -> Path:
    """A shipped Snakemake profile (``local``, ``slurm``, ``frontier``, ``slurm-ci``)."""
    return workflow_dir() / "profiles" / name


def git_commit() -> str | None:
    """The commit of the scalestudy checkout that runs, when there is one."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_PACKAGE,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None
