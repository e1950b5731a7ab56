"""What the Snakefile's rules read, built by one call from Snakemake's ``config``
(:func:`workflow_setup`): the study loaded and validated, its site resolved (the study's
``platform.site``, then a Slurm profile's ``site``) and checked against the site policy, the
secret ``site.env`` values split off the records, the sweep points planned and, for the
launcher's own process, the study claimed (:func:`scalestudy.run.guard.claim_study`)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from typing import Mapping, MutableMapping

from scalestudy.config import sitepolicy
from scalestudy.config.point import Point
from scalestudy.config.parts import Platform
from scalestudy.config.study import load_study
from scalestudy.config.studyspec import Study
from scalestudy.plan.planner import plan_points
from scalestudy.record.source import source_path
from scalestudy.record.io import os_error_line
from scalestudy.run.guard import StudyLocked, claim_study

DEFAULT_STUDY = "workflow/config/default.yaml"


@dataclass(frozen=True)
class WorkflowSetup:
    """One study as the rules see it."""

    study_file: str  # the study file, as given
    source: str  # the study file's resolved path (study.json's source: record/source.py)
    study: Study  # the validated study, ``platform.site`` resolved with secrets redacted
    platform: Platform  # the study's platform (redacted site)
    points: dict[str, Point]  # every planned point (feasible or not) by id, in study order
    feasible: tuple[str, ...]  # the ids of the points that run
    out: str  # the study's results folder: <results>/<study name>
    before_run_max_n: int | None  # predict.before_run's calibrate_on_max_n (None: off)
    lock: int | None  # the study lock's descriptor, held while this process lives (None: not taken)


def is_true(value) -> bool:
    """A Snakemake ``--config`` flag (a string there, a bool from Python) read as a bool."""
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def workflow_setup(config: Mapping, *, claim: bool = False,
                   environ: MutableMapping[str, str] = os.environ) -> WorkflowSetup:
    """The study of Snakemake's ``config`` (keys ``study``, ``results``, ``trust_site``: as
    ``scalestudy run --trust-site``, ``site``: a profile's site settings), ready for the rules.

    The secret ``site.env`` values go into ``environ[SECRETS_ENV]`` (removed when there are
    none): local and Slurm jobs inherit them and the launch puts them back (run/launch.py).
    ``claim``: refuse a results folder another study file made, take the study's lock and
    clear damaged statuses (the launcher's main process; jobs that re-parse the Snakefile take
    nothing). Raises :class:`StudyError` for an invalid study, ``ValueError`` or
    :class:`sitepolicy.SiteError` for a refused site, ``RecordError`` for a folder of another
    study file."""
    study_file = config.get("study", DEFAULT_STUDY)
    trust_site = is_true(config.get("trust_site", False))
    study = load_study(study_file, trust_site=trust_site)
    # unhashed, so a point keeps its id on a laptop and on a cluster
    site = study.platform.site.merged(config.get("site"))
    site.check(trusted=trust_site)
    site, secrets = site.redacted()
    study = replace(study, platform=replace(study.platform, site=site))
    if secrets:
        environ[sitepolicy.SECRETS_ENV] = json.dumps(secrets)
    else:
        environ.pop(sitepolicy.SECRETS_ENV, None)
    points = {p.point_id: p for p in plan_points(study, study_file)}
    feasible = tuple(pid for pid, p in points.items() if p.feasible)
    out = f"{config.get('results', 'results')}/{study.name}"
    source = source_path(study_file)
    try:
        lock = claim_study(out, feasible, source, study.to_json()) if claim else None
    except OSError as e:  # an unwritable results folder: one line, as every other path says
        raise SystemExit(f"scalestudy: error: {os_error_line(e)}") from None
    except StudyLocked as e:  # another launcher: its one line, exit status 2, as the CLI's
        print(f"scalestudy: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return WorkflowSetup(
        study_file=study_file, source=source, study=study, platform=study.platform,
        points=points, feasible=feasible, out=out,
        before_run_max_n=study.predict.before_run_max_n, lock=lock)
