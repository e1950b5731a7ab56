"""What the Snakefile's rules read, built by one call (``scalestudy.run.workflow``): the study,
its site (the study's, then a profile's), the secrets kept out of the records, the points."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scalestudy.config.sitepolicy import REDACTED, SECRETS_ENV, SiteError
from scalestudy.config.study_yaml import StudyError
from scalestudy.run.workflow import workflow_setup

REPO = Path(__file__).resolve().parents[2]
STUDY = str(REPO / "workflow" / "config" / "default.yaml")
SECRET = "s3cr3t-value"


def test_setup_plans_the_study_under_its_results_folder(tmp_path):
    environ = {SECRETS_ENV: "stale"}
    setup = workflow_setup({"study": STUDY, "results": str(tmp_path)}, environ=environ)
    assert setup.study_file == STUDY
    assert setup.out == f"{tmp_path}/{setup.study.name}"
    assert setup.feasible and set(setup.feasible) <= set(setup.points)
    assert all(setup.points[pid].feasible for pid in setup.feasible)
    assert all(pid == p.point_id for pid, p in setup.points.items())
    assert setup.platform == setup.study.platform
    assert setup.lock is None and not (tmp_path / setup.study.name).exists()
    assert SECRETS_ENV not in environ  # no secret: a stale value is dropped


def test_profile_site_wins_and_its_secrets_stay_out_of_the_study(tmp_path):
    environ: dict = {}
    site = {"env": {"NCCL_DEBUG": "WARN", "MY_API_TOKEN": SECRET}, "rdzv_port": "29555"}
    setup = workflow_setup({"study": STUDY, "results": str(tmp_path), "site": site,
                            "trust_site": "True"}, environ=environ)
    recorded = setup.study.platform.site
    assert recorded.env == {"NCCL_DEBUG": "WARN", "MY_API_TOKEN": REDACTED}
    assert recorded.rdzv_port == 29555  # a profile's string, coerced
    assert setup.platform.site == recorded
    assert json.loads(environ[SECRETS_ENV]) == {"MY_API_TOKEN": SECRET}
    assert all(SECRET not in p.json_text() for p in setup.points.values())


def test_a_refused_site_or_study_stops_the_setup(tmp_path):
    with pytest.raises(SiteError, match="LD_PRELOAD"):
        workflow_setup({"study": STUDY, "site": {"env": {"LD_PRELOAD": "x.so"}}}, environ={})
    with pytest.raises(ValueError, match="unknown key 'gpu'"):
        workflow_setup({"study": STUDY, "site": {"gpu": 1}}, environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    with pytest.raises(StudyError):
        workflow_setup({"study": str(bad)}, environ={})


def test_the_launcher_claims_the_study(tmp_path):
    setup = workflow_setup({"study": STUDY, "results": str(tmp_path)}, claim=True, environ={})
    try:
        assert isinstance(setup.lock, int)
        assert (Path(setup.out) / ".lock").is_file()
    finally:
        os.close(setup.lock)


def test_the_local_profile_keeps_snakemakes_own_process_quiet():
    """Snakemake re-selects jobs on a timer of its rate limit's timespan (one more timer chain
    per finished job) and its default selector starts a solver each time: beside a timed run
    on a small host that took ~15% of a core. The local profile selects greedily, without
    the file-size ordering, and re-selects every 2 s (longer made jobs wait for it)."""
    import humanfriendly
    import yaml

    prof = yaml.safe_load((REPO / "workflow" / "profiles" / "local" / "config.yaml").read_text())
    assert prof["scheduler"] == "greedy"
    assert prof["scheduler-greedy-omit-prioritize-by-temp-and-input"] is True
    jobs, span = prof["max-jobs-per-timespan"].split("/")
    assert int(jobs) >= 100 and 2 <= humanfriendly.parse_timespan(span) <= 5
