"""The shipped examples: the FSDP2 Llama-style script swept through a ``command`` workload end
to end through Snakemake on CPU (examples/fsdp_llama), and the Megatron-LM / torchtitan
study, which only plans here (no GPU, neither trainer installed)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from scalestudy.run.snakemake import snakemake_argv

ROOT = Path(__file__).resolve().parents[2]
FSDP_STUDY = ROOT / "examples" / "fsdp_llama" / "study.yaml"
BYO_STUDY = ROOT / "examples" / "megatron_torchtitan" / "study.yaml"
TITAN_V03_STUDY = ROOT / "examples" / "torchtitan_v03" / "study.yaml"


@pytest.mark.workflow
@pytest.mark.timeout(500)
def test_fsdp_example_runs_like_the_builtin_trainer(tmp_path):
    """4 points (weak and strong, N = 1, 2) of the plain FSDP2 script: every run ok, the
    runner's record complete, runs.csv rows with the built-in trainer's columns and FLOPs
    from the declared shape, efficiency curves with their CIs."""
    results = tmp_path / "results"
    out = results / "fsdp-llama"
    targets = [str(out / "efficiency.csv")]  # (the figures are drawn from it, as for builtin runs)
    argv = snakemake_argv(str(FSDP_STUDY), str(results),
                          str(ROOT / "workflow" / "profiles" / "local"), [])
    argv[3:3] = targets  # before --config, which takes the rest
    r = subprocess.run(argv, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (r.stdout + r.stderr).count("rule train:") == 4

    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and (runs["status"] == "ok").all(), runs[["point_id", "reason"]]
    assert (runs["workload"] == "command").all()
    from scalestudy.analysis.aggregate import RUN_COLUMNS
    from scalestudy.config.point import Point
    from scalestudy.config import flops

    assert list(runs.columns) == RUN_COLUMNS
    for row in runs.itertuples():
        run = out / "runs" / row.point_id
        point = Point.from_json(json.loads((run / "point.json").read_text()))
        assert row.model_flops_per_step == pytest.approx(
            flops.model_flops_per_step(point.model, point.global_batch), rel=1e-5)  # %.6g
        assert row.n_steady_steps == 4 and row.tokens_per_s_per_device > 0
        assert row.loss_last < row.loss_first  # the script really trains
        env = json.loads((run / "env.json").read_text())
        assert env["workload"]["argv"][1] == "train.py"
        assert env["workload"]["cwd"] == str(FSDP_STUDY.parent)
        assert shlex.join(env["launch_argv"]) == env["command"]
        assert f"--grad-accum {point.grad_accum} " in env["command"]
    assert runs["mfu"].isna().all()  # CPU: no spec peak, never a guess

    eff = pd.read_csv(out / "efficiency.csv")
    print("\n" + eff[["series", "mode", "n", "global_batch", "step_time_s",
                      "tokens_per_s_per_device", "efficiency", "efficiency_ci_lo",
                      "efficiency_ci_hi", "speedup"]].to_string(index=False))
    assert set(eff["series"]) == {"weak", "strong"} and len(eff) == 4
    base = eff[eff["n"] == eff["baseline_n"]]
    assert (base["efficiency"] - 1).abs().max() < 1e-12
    for r2 in eff[eff["n"] == 2].itertuples():
        assert r2.efficiency > 0 and r2.efficiency_ci_lo <= r2.efficiency <= r2.efficiency_ci_hi


def test_megatron_torchtitan_example_plans(tmp_path):
    """Not run in CI (GPUs, Megatron-LM, torchtitan): `scalestudy plan` works, and every point
    fills its command with its own layout and batch."""
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "plan", str(BYO_STUDY)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "6 runs planned, 6 feasible" in r.stdout

    from scalestudy.config.study import load_study
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.template import command_argv

    for p in plan_points(load_study(BYO_STUDY)):
        argv = command_argv(p, tmp_path, python="python")

        def flag(name):
            return argv[argv.index(name) + 1]

        if p.workload.metrics == "megatron":
            assert (flag("--tensor-model-parallel-size"), flag("--global-batch-size"),
                    flag("--num-query-groups"), flag("--rotary-base"), flag("--ffn-hidden-size")) \
                == (str(p.tp), str(p.global_batch), "8", "500000", "14336")
        else:
            assert p.workload.metrics == "torchtitan" and p.workload.cwd == "/opt/torchtitan"
            assert (flag("--parallelism.data_parallel_shard_degree"),
                    flag("--training.global_batch_size"), flag("--activation_checkpoint.mode")) \
                == (str(p.dp), "64", "full")


def test_torchtitan_v03_example_plans(tmp_path):
    """torchtitan >= 0.3 takes other options than 0.2.x (a config registry: --module/--config;
    --dataloader.dataset; --hf_assets_path): `scalestudy plan` works, every point fills the
    0.3 options with its own layout and batch, and no 0.2.x-only option is left (0.3.0
    refuses them: "Unrecognized options")."""
    r = subprocess.run([sys.executable, "-m", "scalestudy.cli", "plan", str(TITAN_V03_STUDY)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "3 runs planned, 3 feasible" in r.stdout
    head = TITAN_V03_STUDY.read_text().split("name:")[0]
    assert "torchtitan 0.3.0" in head and "examples/megatron_torchtitan" in head

    from scalestudy.config.study import load_study
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.template import command_argv

    for p in plan_points(load_study(TITAN_V03_STUDY)):
        argv = command_argv(p, tmp_path, python="python")

        def flag(name):
            return argv[argv.index(name) + 1]

        assert (flag("--module"), flag("--config"), flag("--training.global_batch_size"),
                flag("--parallelism.data_parallel_shard_degree"), flag("--training.steps")) \
            == ("llama3", "llama3_8b", "64", str(p.dp), "30")
        assert not {"--job.config_file", "--training.dataset", "--model.hf_assets_path",
                    "--activation_checkpoint.mode"} & set(argv)
    # the 0.2.x example states its versions and points to this one
    byo_head = BYO_STUDY.read_text().split("name:")[0]
    assert "torchtitan v0.2.x" in byo_head and "Megatron-LM core_v0.12.0" in byo_head
    assert "examples/torchtitan_v03/study.yaml" in byo_head
