"""The typed study (config/studyspec.py) and site settings (config/site.py): built once after
validation, their JSON forms (study.json, point.json's platform.site) and the site's own
one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Platform, Workload
from scalestudy.config.checks import PointError
from scalestudy.config.identity import identify
from scalestudy.config.site import SITE_KEYS, Site
from scalestudy.config.sitepolicy import SiteError
from scalestudy.config.study import load_study, validate
from scalestudy.config.studyspec import Microbench, Predict, Report, Series, Study
from scalestudy.config.vocab import DPMode, FigureStyle, FlopsConvention, GPURequest

MINIMAL = {"name": "s", "models": {"m": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 32,
                                         "vocab": 64}},
           "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                       "micro_batch": 2}]}


def test_shipped_studies_round_trip_through_their_json_form(repo):
    paths = sorted((repo / "workflow/config").glob("*.yaml")) + sorted(
        (repo / "examples").glob("*/study.yaml"))
    assert len(paths) >= 4
    for path in paths:
        study = load_study(path)
        doc = json.loads(json.dumps(study.to_json()))  # as study.json holds it
        assert Study.from_validated(doc) == study, path
        assert doc == study.to_json(), path


def test_the_json_form_has_the_validated_documents_keys():
    doc = validate(MINIMAL).to_json()
    assert set(doc) == {"name", "description", "models", "series", "repeats", "retries",
                        "flops_convention", "workload", "references", "train", "parallel",
                        "platform", "report", "microbench", "predict", "profile", "export"}
    assert "name" not in doc["models"]["m"] and doc["models"]["m"]["mlp"] == "gelu"
    assert doc["series"] == [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2],
                              "micro_batch": 2, "tp": 1, "pp": 1, "cp": 1, "grad_accum": 1}]
    assert doc["predict"] == {"before_run": None} and doc["workload"] == "builtin"
    assert set(doc["platform"]["site"]) == set(SITE_KEYS)


def test_defaults_are_the_schemas():
    s = validate(MINIMAL)
    assert s.description == "" and s.repeats == 1 and s.retries == 0 and s.references == ()
    assert s.flops_convention == FlopsConvention.MEGATRON and s.workload == Workload()
    assert s.models == {"m": Model(name="m", layers=2, hidden=64, heads=4, seq_len=32,
                                   vocab=64)}
    assert s.microbench == Microbench(enabled=False, matmul_sizes=(256, 512, 1024),
                                      dtypes=("fp32",), sizes=(4096, 65536, 1048576, 8388608),
                                      group_sizes=(2,))
    assert s.report == Report(figure_style=FigureStyle.DEFAULT)
    assert s.predict == Predict(before_run_max_n=None)
    assert s.platform == Platform() and s.platform.site == Site()
    (series,) = s.series
    assert (series.gpus, series.tp, series.grad_accum, series.global_batch) == ((1, 2), 1, 1, None)
    assert series.settings == {} and series.workload is None  # not given: the study's


def test_a_series_sweeps_tuples_and_overrides_the_studys_parallel_settings():
    s = validate({**MINIMAL, "parallel": {"dp_mode": "fsdp", "virtual_stages": 2},
                  "series": [{**MINIMAL["series"][0], "tp": [1, 2],
                              "dp_mode": ["ddp", "zero1"], "pp_partition": [1, 1]}]})
    (series,) = s.series
    assert series.tp == (1, 2) and series.settings["dp_mode"] == (DPMode.DDP, DPMode.ZERO1)
    assert series.settings["pp_partition"] == (1, 1)  # a stated partition, not a sweep
    one = replace(series, tp=2, settings={**series.settings, "dp_mode": "zero1"})
    par = one.parallel(s.parallel)
    assert (par.dp_mode, par.virtual_stages, par.pp_partition) == ("zero1", 2, (1, 1))
    assert Series.from_validated(json.loads(json.dumps(series.to_json()))) == series


def test_site_layers_merge_and_profile_text_is_converted_once():
    # Snakemake hands profile `config:` values over as strings (YAML BaseLoader)
    s = Site.resolve({"partition": "a", "env": {"X": 1}, "gpus_per_node": 4},
                     {"gpus_per_node": "8", "exclusive": "true", "env": {"Y": "2"},
                      "account": "", "gpu_request": "gpus-per-node", "partition": None})
    assert s.gpus_per_node == 8 and s.exclusive is True and s.account is None
    assert s.env == {"X": "1", "Y": "2"} and s.partition == "a"  # null keeps the earlier value
    assert s.gpu_request is GPURequest.GPUS_PER_NODE
    assert Site.resolve() == Site() and Site().merged(None) == Site()
    assert Site.resolve({"account": "abc"}).merged({"account": None, "qos": "q"}) == \
        Site(account="abc", qos="q")
    assert Site.resolve(s.to_json()) == s
    assert list(s.to_json()) == list(SITE_KEYS)


@pytest.mark.parametrize("layer, error", [
    ({"partiton": "x"}, "site: unknown key 'partiton'; did you mean 'partition'? known keys: "
                        "partition, account,"),
    ({"zzz": 1}, "site: unknown key 'zzz'; known keys: partition,"),
    ({"gpus_per_node": "eight"}, "site.gpus_per_node: expected an integer, got 'eight'"),
    ({"rdzv_port": [1]}, "site.rdzv_port: expected an integer, got [1]"),
    ({"gpu_request": "gpu"}, "site.gpu_request: 'gpu'; use one of gres, gpus-per-node, none"),
])
def test_site_errors_are_one_line(layer, error):
    with pytest.raises(ValueError) as e:
        Site.resolve(layer)
    assert str(e.value).startswith(error) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(PointError, match=f"^platform.{error.split(':')[0]}"):
        Platform(site=layer)


@pytest.mark.parametrize("site, error", [
    ({"env": {"LD_PRELOAD": "x.so"}}, "here.env.LD_PRELOAD: not allowed without --trust-site"),
    ({"torchrun_extra": "--no-python"}, "here.torchrun_extra: --no-python is not allowed"),
    ({"srun_extra": "hostname"}, "here.srun_extra: 'hostname' is not an option of srun"),
    ({"extra": "--wrap=x"}, "here.extra: --wrap is not allowed"),
])
def test_site_policy_check(site, error):
    with pytest.raises(SiteError) as e:
        Site.resolve(site).check(where="here")
    assert str(e.value).startswith(error) and "\n" not in str(e.value), str(e.value)
    if "env" in site:
        Site.resolve(site).check(trusted=True, where="here")  # --trust-site allows it


def test_a_points_site_is_typed_in_point_json_and_keeps_the_hash():
    site = {"gpus_per_node": "2", "env": {"NCCL_DEBUG": "WARN"}, "exclusive": True}
    p = identify(Point.for_layout(Model(), dp=2, device="cuda", devices_per_node=2, site=site))
    assert isinstance(p.platform.site, Site) and p.platform.site.gpus_per_node == 2
    doc = json.loads(p.json_text())
    assert doc["platform"]["site"] == Site.resolve(site).to_json()
    back = Point.from_json(doc)
    assert back == p and back.config_hash == p.config_hash
    # the hash sees the measured settings, not the allocation's
    moved = replace(p.platform, site=p.platform.site.merged({"partition": "other"}))
    assert identify(p.replace(platform=moved)).config_hash == p.config_hash
    quiet = replace(p.platform, site=p.platform.site.merged({"env": {"NCCL_DEBUG": "INFO"}}))
    assert identify(p.replace(platform=quiet)).config_hash != p.config_hash
    with pytest.raises(PointError, match="platform.site: 'x' is not allowed"):
        Platform(site="x")
