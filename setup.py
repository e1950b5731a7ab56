"""Build-time mapping of the workflow into the package.

The Snakefile, rules, schema, study files, profiles, report captions and conda environments
live in the repository's ``workflow/`` (where Snakemake and the design expect them). A built
wheel carries a copy as package data, ``scalestudy/workflow/``, so ``pip install .`` gives a
``scalestudy`` that runs a study from any directory (``scalestudy.paths`` finds either).
Everything else is declared in ``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WORKFLOW = Path(__file__).resolve().parent / "workflow"


class BuildWithWorkflow(build_py):
    def run(self):
        super().run()
        target = Path(self.build_lib) / "scalestudy" / "workflow"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(WORKFLOW, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithWorkflow})
