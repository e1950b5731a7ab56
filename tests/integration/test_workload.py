"""Command workloads: the argv template filled from the typed point (one argument per
element, no shell, hostile values refused or kept inside their argument), the study's
checks, the launch lines, and the runner end to end on a stand-in trainer (tests/fake_trainer.py)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Workload
from scalestudy.config.checks import PointError
from scalestudy.config.identity import config_hash
from scalestudy.config.study import validate
from scalestudy.config.study_yaml import StudyError
from scalestudy.plan.planner import plan_points
from scalestudy.config import template as tmpl
from scalestudy.config.template import TemplateError, expand
from scalestudy.run import launch, workload

ROOT = Path(__file__).resolve().parents[2]
FAKE = str(ROOT / "tests" / "fake_trainer.py")

STUDY = {
    "name": "byo",
    "models": {"m": {"arch": "llama", "layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2,
                     "seq_len": 16, "vocab": 64}},
    "train": {"steps": 5, "warmup_steps": 2},
    "platform": {"device": "cpu", "devices_per_node": 4},
    "workload": {"command": ["{python}", FAKE, "megatron", "--steps", "{steps}",
                             "--global-batch={global_batch}", "--seq-len", "{seq_len}"],
                 "metrics": "megatron"},
    "series": [{"name": "w", "mode": "weak", "model": "m", "gpus": [1, 2], "micro_batch": 2}],
}


def study(**changes) -> dict:
    s = copy.deepcopy(STUDY)
    s.update(changes)
    return s


def command_point(template, model: Model | None = None, **kw) -> Point:
    p = Point.for_layout(model or Model(), dp=2, micro_batch=2, device="cpu",
                         workload=Workload(kind="command", command=tuple(template)), **kw)
    return p.replace(config_hash="0" * 64, point_id="p")


# --- filling a template ------------------------------------------------------------------------

def test_placeholders_are_filled_from_the_point():
    p = command_point(["{python}", "train.py", "--tp={tp}", "{dp}", "{global_batch}",
                       "--kv", "{kv_heads}", "{ffn}", "--lr", "{lr}", "{{literal}}",
                       "{sequence_parallel}", "{point_dir}/out"],
                      model=Model(arch="llama", hidden=64, heads=4, kv_heads=2))
    argv = tmpl.command_argv(p, "/runs/p", python="/py")
    assert argv == ["/py", "train.py", "--tp=1", "2", "4", "--kv", "2", "176", "--lr", "0.003",
                    "{literal}", "false", "/runs/p/out"]


def test_whole_floats_fill_as_integers():
    m = Model(arch="llama", rope_theta=500000.0, ffn_dim_multiplier=1.3, multiple_of=32)
    p = command_point(["x", "{rope_theta}", "{ffn_dim_multiplier}", "{norm_eps}"], model=m)
    assert tmpl.command_argv(p, "/d")[1:] == ["500000", "1.3", "1e-05"]


@pytest.mark.parametrize("element, word", [
    ("{nope}", "unknown placeholder {nope}"),
    ("{n:>4}", "unknown placeholder {n:>4}"),  # no format mini-language
    ("{model.__class__}", "unknown placeholder {model.__class__}"),  # no attribute access
    ("{n", "unmatched '{'"), ("n}", "unmatched '}'"),
])
def test_bad_templates_are_refused(element, word):
    with pytest.raises(TemplateError, match=re.escape(word)):
        tmpl.check_template(["train", element])


def test_the_program_is_the_templates_own():
    with pytest.raises(TemplateError, match=r"command\[0\].*literal path or \{python\}"):
        tmpl.check_template(["{model}", "x"])
    with pytest.raises(TemplateError, match="never a shell string"):
        tmpl.check_template("python train.py --tp {tp}")


HOSTILE = [
    "two words", "it's \"quoted\"", "a; rm -rf /tmp/x", "$(touch PWNED)", "`touch PWNED`",
    "line\nbreak", "x && echo hi > PWNED", "--evil", "-rf", "*", "~/$HOME", "a|b", "\t",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_stays_inside_its_argument(value, tmp_path):
    """Values reach the command only inside their own argument: as many arguments as the
    template has, each exactly as filled; none is read by a shell (nothing is created)."""
    template = ["{python}", "-c", "import json, sys; print(json.dumps(sys.argv[1:]))",
                "--name={model}", "{point_dir}", "prefix-{model}"]
    point_dir = tmp_path / value.replace("/", "_").replace("\x00", "")[:20]
    if re.search(r"[\x00-\x1f\x7f/\\]", value):  # a separator or control character ...
        with pytest.raises(PointError, match="model.name"):
            Model(name=value)  # ... never reaches a command: the typed point refuses it
        return
    p = command_point(template, model=Model(name=value))
    argv = tmpl.command_argv(p, point_dir)
    assert len(argv) == len(template)
    assert argv[3:] == [f"--name={value}", str(point_dir), f"prefix-{value}"]
    got = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert json.loads(got.stdout) == argv[3:]
    assert not list(tmp_path.glob("PWNED*")) and not (Path.cwd() / "PWNED").exists()


@pytest.mark.parametrize("value", ["--evil", "-rf", "-"])
def test_a_value_cannot_become_an_option(value):
    """A value that would make an argument start with '-' where the template's does not is
    an option smuggled in: refused (inside '--name={model}' it is just the option's value)."""
    p = command_point(["train", "{model}"], model=Model(name=value))
    with pytest.raises(TemplateError, match="start with '-'"):
        tmpl.command_argv(p, "/d")
    ok = command_point(["train", "--name={model}"], model=Model(name=value))
    assert tmpl.command_argv(ok, "/d") == ["train", f"--name={value}"]


def test_a_nul_byte_is_refused():
    with pytest.raises(TemplateError, match="NUL"):
        expand(["train", "{model}"], {"model": "a\x00b"})


def test_a_placeholder_without_a_value_is_refused():
    with pytest.raises(TemplateError, match=r"\{multiple_of\} has no value"):
        tmpl.command_argv(command_point(["t", "{multiple_of}"]), "/d")


# --- the study, the point, the plan ----------------------------------------------------------

def test_workload_is_part_of_the_hash_and_the_point():
    points = plan_points(validate(study()))
    p = points[0]
    assert p.workload.is_command and p.workload.metrics == "megatron"
    assert Point.from_json(json.loads(p.json_text())) == p
    builtin = p.replace(workload=Workload())
    other = p.replace(workload=Workload(kind="command", command=p.workload.command[:-1]))
    assert len({config_hash(p), config_hash(builtin), config_hash(other)}) == 3
    moved = p.replace(workload=Workload(**{**p.workload.__dict__, "cwd": "/elsewhere"}))
    assert config_hash(moved) == config_hash(p)  # where it runs is not what it measures


@pytest.mark.parametrize("change, message", [
    ({"workload": "command"}, "workload: command needs its argv"),
    ({"workload": {"command": "python train.py"}}, "workload.command: 'python train.py' is not allowed"),
    ({"workload": {"command": ["python", "t.py", "{gpus}"]}}, "workload.command[2] '{gpus}': unknown placeholder"),
    ({"workload": {"command": ["python", "t.py"], "metrics": "log"}}, "workload.metrics: log needs its expressions"),
    ({"workload": {"command": ["python", "t.py"], "metrics": {"log": {"step_time_s": "("}}}},
     "workload.metrics.log.step_time_s: not a regular expression"),
    ({"workload": {"command": ["python", "t.py"], "flops_per_token": -1}}, "workload.flops_per_token: -1 is not allowed"),
    ({"workload": {"command": ["python", "t.py", "{multiple_of}"]}}, "series 'w'.workload.command[2] '{multiple_of}': {multiple_of} has no value"),
])
def test_bad_workloads_fail_before_any_job(change, message):
    with pytest.raises(StudyError) as e:
        plan_points(validate(study(**change), "s.yaml"))
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_series_workload_overrides_the_studys():
    s = study()
    s["series"].append(dict(s["series"][0], name="builtin", workload="builtin"))
    kinds = {p.series: p.workload.kind for p in plan_points(validate(s))}
    assert kinds == {"w": "command", "builtin": "builtin"}


def test_cwd_is_the_study_files_folder(tmp_path):
    from scalestudy.config.study import load_study
    from scalestudy.config.study_yaml import dump_study

    s = study()
    s["series"].append(dict(s["series"][0], name="w2", micro_batch=1,
                            workload=dict(s["workload"], cwd="sub")))
    path = tmp_path / "s.yaml"
    path.write_text(dump_study(s))
    cwd = {p.series: p.workload.cwd for p in plan_points(load_study(path))}
    assert cwd == {"w": str(tmp_path), "w2": str(tmp_path / "sub")}


def test_builtin_workload_has_no_command_settings():
    with pytest.raises(PointError, match="settings of kind command"):
        Workload(kind="builtin", metrics="megatron")


# --- the launch -----------------------------------------------------------------------------

def test_launch_runs_the_command_as_torchruns_script():
    p = plan_points(validate(study()))[1]  # N = 2
    run = Path("/r/runs") / p.point_id
    argv = launch.launch_argv(p, run, python="/py", environ={})
    i = argv.index("--no-python")
    assert argv[:5] == ["/py", *launch.TORCHRUN] and "--nproc-per-node" in argv[:i]
    assert argv[i + 1:] == ["/py", FAKE, "megatron", "--steps", "5", "--global-batch=4",
                            "--seq-len", "16"]
    assert "scalestudy.train" not in argv
    # several nodes: srun + the node launcher, the same script part after "--"
    p4 = p.replace(nodes=2, procs_per_node=1)
    srun = launch.launch_argv(p4, run, python="/py", environ={"SLURM_JOB_ID": "9"})
    assert srun[0] == "srun" and srun[srun.index("--") + 1:] == argv[i:]
    local = launch.launch_argv(p4, run, python="/py", environ={})
    assert local[local.index("--") + 1:] == argv[i:]
    assert workload.command_env(p, run) == {"SCALESTUDY_POINT_DIR": str(run),
                                            "SCALESTUDY_POINT_JSON": str(run / "point.json")}


# --- the runner, end to end on a stand-in trainer ---------------------------------------------

def _run(tmp_path, s: dict, n: int = 2) -> tuple[dict, Path]:
    p = next(p for p in plan_points(validate(s)) if p.n == n)
    run = tmp_path / "runs" / p.point_id
    run.mkdir(parents=True)
    (run / "point.json").write_text(p.json_text())
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "scalestudy", "run-point", "--job", str(run / "point.json"),
                    str(run)], env=env, cwd=tmp_path, check=True, timeout=300,
                   capture_output=True)
    return json.loads((run / "status.json").read_text()), run


@pytest.mark.dist
def test_runner_reads_a_megatron_log_like_a_builtin_record(tmp_path):
    status, run = _run(tmp_path, study())
    assert status["state"] == "ok", status
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert [s["warmup"] for s in steps] == [True, True, False, False, False]
    assert steps[2]["step_time_s"] == pytest.approx(0.020) and steps[2]["tokens"] == 4 * 16
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workload"] == "command" and summary["metrics"] == "megatron"
    assert "23.04" in summary["metrics_reads"] and "core_v0.19.0" in summary["metrics_reads"]
    assert summary["step_time_median_s"] == pytest.approx(0.021)
    assert summary["loss_last"] == pytest.approx(5.5)
    assert summary["model_flops_per_step"]["megatron"] > 0  # from the model block
    env = json.loads((run / "env.json").read_text())
    assert env["workload"]["template"] == STUDY["workload"]["command"]
    assert env["workload"]["argv"][1:] == [FAKE, "megatron", "--steps", "5", "--global-batch=4",
                                           "--seq-len", "16"]
    assert env["launch_argv"][-len(env["workload"]["argv"]):] == env["workload"]["argv"]
    assert env["env_added"]["SCALESTUDY_POINT_DIR"] == str(run)

    from conftest import run_row

    from scalestudy.analysis.aggregate import RUN_COLUMNS

    row, times, _ = run_row({"point_id": run.name, "tokens_per_step": 64, "n": 2,
                             "precision": "fp32", "feasible": True}, run, None, "megatron")
    assert row["status"] == "ok" and len(times) == 3 and set(row) == set(RUN_COLUMNS) - {
        "study", "series", "mode", "model", "config_hash", "repeat", "dp", "tp", "pp", "cp", "nodes",
        "micro_batch", "grad_accum", "global_batch", "seq_len", "tokens_per_device_step",
        "dp_mode", "pp_schedule", "activation_checkpointing", "baseline_n", "mem_estimate_gb",
        "workload"}
    assert row["tokens_per_s_per_device"] == pytest.approx(64 / 0.021 / 2)


@pytest.mark.dist
def test_runner_marks_missing_metrics_invalid(tmp_path):
    s = study(workload={"command": ["{python}", FAKE, "nothing", "--steps", "{steps}",
                                   "--global-batch", "{global_batch}", "--seq-len", "{seq_len}"]})
    status, run = _run(tmp_path, s, n=1)
    assert status["state"] == "invalid" and status["exit_code"] == 0, status
    assert "wrote no steps.jsonl into $SCALESTUDY_POINT_DIR" in status["reason"]
    assert status["attempts"] == [{"state": "invalid", "reason": status["reason"],
                                   "wall_s": status["wall_s"]}]  # deterministic: no retry
    assert not (run / "summary.json").exists() and (run / "env.json").exists()


@pytest.mark.dist
def test_a_command_with_profiling_asked_that_left_no_trace_says_so(tmp_path):
    from dataclasses import replace

    from scalestudy.record.trace_terms import read_breakdown
    from scalestudy.run.runner import no_trace_reason

    s = study(workload={**STUDY["workload"], "traces": "prof/*.json"})
    status, run = _run(tmp_path, s, n=1)
    assert status["state"] == "ok", status
    rec, why = read_breakdown(run)
    assert rec is None and why == ("profiling asked (workload.traces: prof/*.json), but the "
                                   "command left no trace there: nothing in its run folder "
                                   "matches prof/*.json"), why
    # profile.enabled on a command study without workload.traces: said as such
    point = Point.from_json(json.loads((run / "point.json").read_text()))
    bare = point.replace(workload=replace(point.workload, traces=None))
    assert no_trace_reason(bare, run) is None  # the study asks nothing
    (tmp_path / "study.json").write_text(json.dumps(validate(study(profile={"enabled": True}))
                                                    .to_json(), default=str))
    assert no_trace_reason(bare, run).startswith("profiling asked (profile.enabled), but a "
                                                 "command workload traces itself")
