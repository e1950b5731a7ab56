"""Real foreign trainers swept live through ``scalestudy run`` (Snakemake, torchrun, the
runner's record), on CPU processes with gloo:

- torchtitan 0.2.2 from PyPI (the ``foreign`` extra), its own ``torchtitan.train`` through the
  CPU launcher ``tests/titan_cpu.py`` (device selection and the reduce op only), FSDP2, its
  llama3 ``debugmodel``, a tokenizer and a dataset generated here (tests/foreign_assets.py);
  metrics from its own log lines (``metrics: torchtitan``);
- DeepSpeed from PyPI, ZeRO stage 1 on its CPU accelerator (``tests/ds_train.py``), metrics
  through ``steps.jsonl``.

One sweep (a strong torchtitan series over 1 and 2 processes, traced by torchtitan's own
profiler, and a DeepSpeed point on 2) serves every test here. Skipped with the reason where the trainers are not
installed; ``SCALESTUDY_REQUIRE_FOREIGN=1`` (CI, after ``pip install -e .[foreign]``) turns
that skip into a failure."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from scalestudy.run.snakemake import snakemake_argv
from scalestudy.config.study_yaml import dump_study
from scalestudy.paths import profile
from scalestudy.record.terms import MEASURED_TERMS

from conftest import trained
from foreign_assets import DEBUGMODEL, TITAN_TRACES, titan_command, write_assets

ROOT = Path(__file__).resolve().parents[2]
DS_TRAIN = ROOT / "tests" / "ds_train.py"
NEEDED = ("torchtitan", "triton", "deepspeed")
STEPS, WARMUP = 4, 1


def _installed_or_skip():
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        reason = (f"{', '.join(missing)} not installed (pip install -e '.[foreign]' "
                  "-c constraints: see .ci/run)")
        if os.environ.get("SCALESTUDY_REQUIRE_FOREIGN") == "1":
            pytest.fail(f"SCALESTUDY_REQUIRE_FOREIGN=1 but {reason}")
        pytest.skip(reason)


def foreign_study(tokenizer: Path, dataset: Path) -> dict:
    # traced by torchtitan's own profiler, read into its breakdown
    traced = {"command": titan_command(tokenizer, dataset, profile=True),
              "metrics": "torchtitan", "traces": TITAN_TRACES}
    return {
        "name": "foreign",
        # one model for every series: the calibrate job times its matrix products once
        "models": {"debug": {**DEBUGMODEL, "seq_len": 64}},
        "train": {"steps": STEPS, "warmup_steps": WARMUP},
        "platform": {"device": "cpu", "devices_per_node": 2, "timeout_s": 400},
        "series": [
            # N=1 accumulates 2 micro-batches, N=2 one per rank (FSDP2 across them)
            {"name": "titan-strong", "mode": "strong", "model": "debug", "gpus": [1, 2],
             "micro_batch": 1, "global_batch": 2, "dp_mode": "fsdp", "workload": traced},
            # ZeRO-1 across two ranks (at one there is nothing to shard)
            {"name": "ds-weak", "mode": "weak", "model": "debug", "gpus": [2],
             "micro_batch": 1, "dp_mode": "zero1",
             "workload": {"command": ["{python}", str(DS_TRAIN)], "metrics": "steps_jsonl"}},
        ],
    }


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """``(out, runs)``: the study's results folder and its runs.csv, one sweep for all."""
    _installed_or_skip()
    root = tmp_path_factory.mktemp("foreign")
    tokenizer, dataset = write_assets(root / "assets")
    study_file = root / "foreign.yaml"
    study_file.write_text(dump_study(foreign_study(tokenizer, dataset)))
    results = root / "results"
    out = results / "foreign"
    # the run `scalestudy run` starts (local profile), up to the tables (the figures are drawn
    # from them, as for built-in runs, and tested there)
    argv = snakemake_argv(str(study_file), str(results), str(profile("local")), [])
    argv[3:3] = [str(out / "efficiency.csv")]  # before --config, which takes the rest
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert trained(r.stdout + r.stderr) == 3
    return out, pd.read_csv(out / "runs.csv")


# --- an independent read of torchtitan's raw log ---------------------------------------------

# anywhere in a line: the ranks share one log, and another process's output without its newline
# yet (Kineto's "USDT: ... profiler_start") can run into the start of a step line
TITAN_STEP = re.compile(r"(?:\[rank\d+\]:)?\[titan\] (\S+ \S+) - root - INFO - step:\s*(\d+)\s+"
                        r"loss:\s*(\S+)\s+.*\btps:\s*([\d,]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def titan_steps(log: Path) -> dict[int, list[tuple[datetime, float]]]:
    """step -> [(timestamp, tps)] of every rank's step line."""
    steps: dict[int, list] = {}
    for line in ANSI.sub("", log.read_text(errors="replace")).splitlines():
        m = TITAN_STEP.search(line)
        if m:
            stamp = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            tps = float(m.group(4).replace(",", ""))
            steps.setdefault(int(m.group(2)), []).append((stamp, tps))
    return steps


def test_every_point_ok(sweep):
    out, runs = sweep
    assert len(runs) == 3 and (runs["status"] == "ok").all(), runs[["point_id", "reason"]]
    assert (runs["n_steady_steps"] == STEPS - WARMUP).all()
    assert set(runs["n"]) == {1, 2}


def test_torchtitan_times_equal_the_raw_log(sweep):
    """runs.csv's step time and tokens/s equal a recompute from torchtitan's own lines: tps
    is tokens per second per device, so a step takes tokens_per_step / (tps × N) (the slowest
    rank's line); and that time is the log's own clock between consecutive step lines."""
    out, runs = sweep
    titan = runs[runs["series"].str.startswith("titan")]
    assert len(titan) == 2
    for row in titan.itertuples():
        run = out / "runs" / row.point_id
        steps = titan_steps(run / "stdout.log")
        assert sorted(steps) == list(range(1, STEPS + 1))
        assert all(len(v) == row.n for v in steps.values())  # every rank logs every step
        t = {s: max(row.tokens_per_step / (tps * row.n) for _, tps in v) for s, v in steps.items()}
        median = statistics.median(t[s] for s in range(WARMUP + 1, STEPS + 1))
        assert row.step_time_median_s == pytest.approx(median, rel=1e-5)
        assert row.tokens_per_s == pytest.approx(row.tokens_per_step / median, rel=1e-5)
        assert row.tokens_per_s_per_device == pytest.approx(row.tokens_per_s / row.n, rel=1e-5)
        # the log's clock: rank 0's line of step s minus its line of step s-1
        for s in range(WARMUP + 1, STEPS + 1):
            dt = (min(v[0] for v in steps[s]) - min(v[0] for v in steps[s - 1])).total_seconds()
            assert dt == pytest.approx(t[s], rel=0.25, abs=0.02), (s, dt, t[s])
        print(f"\n{row.series} N={row.n}: {row.tokens_per_s:.1f} tokens/s (runs.csv) = "
              f"{row.tokens_per_step / median:.1f} (raw log), step {median:.3f} s")


def test_torchtitan_trained_the_points_batch(sweep):
    """The batch, sequence length and steps torchtitan printed are the point's (the runner
    checked them; here read again), memory is unmeasured on CPU: empty with the reason."""
    out, runs = sweep
    for row in runs[runs["series"].str.startswith("titan")].itertuples():
        text = (out / "runs" / row.point_id / "stdout.log").read_text(errors="replace")
        init = re.findall(r"Trainer is initialized with local batch size (\d+), global batch "
                          r"size (\d+), gradient accumulation steps (\d+), sequence length "
                          r"(\d+), total steps (\d+)", text)
        assert len(init) == row.n
        assert set(init) == {(str(row.micro_batch), str(row.global_batch), str(row.grad_accum),
                              str(row.seq_len), str(STEPS))}
        assert "memory: -0.00GiB(-100.00%)" in text
        assert pd.isna(row.peak_memory_gb) and "no memory statistics" in row.memory_note
        losses = re.findall(r"\bstep:\s*\d+\s+loss:\s*(\S+)", ANSI.sub("", text))
        assert len(losses) == STEPS * row.n and all(math.isfinite(float(x)) for x in losses)
        summary = json.loads((out / "runs" / row.point_id / "summary.json").read_text())
        assert summary["metrics"] == "torchtitan" and "0.2.2" in summary["metrics_reads"]


def test_deepspeed_zero1_points(sweep):
    out, runs = sweep
    ds = runs[runs["series"] == "ds-weak"]
    assert len(ds) == 1 and (ds["workload"] == "command").all()
    for row in ds.itertuples():
        run = out / "runs" / row.point_id
        steps = [json.loads(x) for x in (run / "steps.jsonl").read_text().splitlines()]
        assert len(steps) == STEPS and {s["tokens"] for s in steps} == {row.tokens_per_step}
        steady = [s["step_time_s"] for s in steps if not s["warmup"]]
        assert row.step_time_median_s == pytest.approx(statistics.median(steady), rel=1e-5)
        assert all(math.isfinite(s["loss"]) for s in steps)  # (4 steps: too few to see it fall)


def test_efficiency_at_the_baseline_is_one(sweep):
    out, _ = sweep
    eff = pd.read_csv(out / "efficiency.csv")
    assert set(eff["series"]) == {"titan-strong", "ds-weak"} and len(eff) == 3
    base = eff[eff["n"] == eff["baseline_n"]]
    assert len(base) == 2 and (base["efficiency"] - 1).abs().max() < 1e-12
    two = eff[eff["n"] == 2]
    assert (two["efficiency"] > 0).all()
    print("\n" + eff[["series", "n", "step_time_s", "tokens_per_s_per_device",
                      "efficiency"]].to_string(index=False))


# --- the checks, on the real trainer's log -------------------------------------------------

def _point(out: Path, run_id: str, **changes):
    from scalestudy.config.point import Point

    p = Point.from_json(json.loads((out / "runs" / run_id / "point.json").read_text()))
    return p.replace(**changes) if changes else p


@pytest.mark.parametrize("change, says", [
    ("global_batch", "says global batch 2"),
    ("seq_len", "says sequence length 64"),
    ("steps", "says step count 4"),
])
def test_a_point_the_real_log_does_not_match_is_invalid(sweep, change, says):
    """torchtitan's real log read for a point with another global batch, sequence length or
    step count: the reason names what the log says."""
    import dataclasses

    from scalestudy.run.collect import steps_from_log

    out, runs = sweep
    row = runs[(runs["series"] == "titan-strong") & (runs["n"] == 2)].iloc[0]
    p = _point(out, row.point_id)
    if change == "global_batch":
        p = p.replace(grad_accum=2, global_batch=4)
    elif change == "seq_len":
        p = p.replace(model=dataclasses.replace(p.model, seq_len=128))
    else:
        p = p.replace(train=dataclasses.replace(p.train, steps=5))
    records, problem, _ = steps_from_log(p, out / "runs" / row.point_id / "stdout.log")
    assert records == [] and problem and says in problem, problem
    records, problem, note = steps_from_log(_point(out, row.point_id),
                                            out / "runs" / row.point_id / "stdout.log")
    assert problem is None and len(records) == STEPS and "no memory statistics" in note


def test_torchtitans_own_trace_is_read_into_the_breakdown(sweep):
    """torchtitan's profiler (its ``--profiling`` options, the trace under its dump folder:
    the workload's ``traces``) is read as the built-in trainer's is: FSDP's gathers and
    reductions are data-parallel traffic, and the terms add up to its traced step."""
    out, runs = sweep
    titan = runs[runs["series"] == "titan-strong"]
    for pid, n in zip(titan["point_id"], titan["n"]):
        rec = json.loads((out / "runs" / pid / "breakdown.json").read_text())
        assert rec["state"] == "ok", rec.get("reason")
        assert rec["ranks"] == list(range(n)) and rec["profiled_steps"] == 1
        assert all(f.startswith("torchtitan/profile_traces/iteration_") for f in rec["files"])
        t = rec["terms"]
        assert abs(sum(t[k] for k in MEASURED_TERMS) - rec["step_s"]) < 1e-9 * rec["step_s"]
        assert t["gemm_s"] > 0 and t["optimizer_s"] > 0
        if n == 2:
            assert t["dp_comm_exposed_s"] + t["sync_wait_s"] + t["dp_comm_overlapped_s"] > 0
    brk = pd.read_csv(out / "breakdown.csv")
    mine = brk[(brk["series"] == "titan-strong") & brk["in_step"]]
    assert mine["measured_s"].notna().all()
    assert not (out / "runs" / runs[runs["series"] == "ds-weak"]["point_id"].iloc[0]
                / "breakdown.json").exists()  # its command traces nothing: no breakdown
