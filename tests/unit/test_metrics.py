"""The steps.jsonl contract (scalestudy.record.steps) and its helper (scalestudy.train.metrics),
and what the runner makes of a command's metrics (scalestudy.run.collect): the same
summary.json and runs.csv row as the built-in trainer's, invalid with a reason when the
metrics are missing or not the point's, FLOPs from the shape, a stated FLOPs-per-token, or
none (no MFU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Workload
from scalestudy.config import flops
from scalestudy.record import steps as contract
from scalestudy.record.run_records import parse_steps
from scalestudy.run import collect
from scalestudy.train.metrics import StepLogger, StepTimer

MODEL = Model(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, seq_len=16, vocab=64)


def point(flops_per_token="shape", metrics_format="steps_jsonl", hardware=None, **kw) -> Point:
    w = Workload(kind="command", command=("python", "t.py"), metrics=metrics_format,
                 flops_per_token=flops_per_token)
    p = Point.for_layout(MODEL, dp=2, micro_batch=2, device="cpu", steps=4, warmup_steps=1,
                         workload=w, hardware=hardware, **kw)
    return p.replace(config_hash="c" * 64, point_id="p")


# --- the helper ------------------------------------------------------------------------------

def test_step_logger_writes_the_contract_once_at_close(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALESTUDY_POINT_DIR", str(tmp_path))
    log = StepLogger(tokens_per_step=64)
    for i in range(3):
        with log.step() as s:
            s.loss = 4.0 - i
    assert not (tmp_path / "steps.jsonl").exists()  # nothing half-written while training
    written = log.close()
    assert log.close() is None  # once
    text = (tmp_path / "steps.jsonl").read_text()
    records, problem = parse_steps(text)
    assert problem is None and records == written
    assert [r["step"] for r in records] == [0, 1, 2] and records[2]["loss"] == 2.0
    assert all(r["tokens"] == 64 and r["step_time_s"] > 0 for r in records)
    assert not list(tmp_path.glob(".*"))  # no temp file left
    with pytest.raises(RuntimeError, match="after close"):
        log.log(0.1, 1.0)


def test_step_logger_outside_scalestudy_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALESTUDY_POINT_DIR", raising=False)
    log = StepLogger(tokens_per_step=8)
    log.log(0.5, None)
    assert log.close() == [{"step": 0, "step_time_s": 0.5, "loss": None, "tokens": 8}]
    with pytest.raises(ValueError, match="tokens per step unknown"):
        StepLogger().log(0.1)


def test_step_timer_reads_the_clock_around_the_block():
    import torch

    timer = StepTimer(torch.device("cpu"))
    with timer:
        sum(range(10000))
    assert timer.last > 0


def test_losses_are_read_after_timing_and_ranks_merge():
    import torch

    log = StepLogger(tokens_per_step=8)
    with log.step() as s:
        s.loss = torch.tensor(2.5)  # a tensor: converted at close, not inside the clock
    assert log.records()[0]["loss"] == 2.5
    a = [contract.step_record(0, 0.1, 2.0, 8), contract.step_record(1, 0.3, 1.0, 8)]
    b = [contract.step_record(0, 0.2, None, 8), contract.step_record(1, 0.1, 3.0, 8)]
    merged = contract.merge_ranks([a, b])
    # the ranks' mean (record.steps.rank_step_time), not the slowest rank
    assert [r["step_time_s"] for r in merged] == pytest.approx([0.15, 0.2])
    assert [r["loss"] for r in merged] == [2.0, 2.0]  # mean of the ranks that know it


@pytest.mark.parametrize("text, problem", [
    ('{"step": 0, "step_time_s": 0.1, "loss": 1.0}', "line 1: no tokens"),
    ('{"step": 0, "step_time_s": 0, "loss": 1.0, "tokens": 8}', "step_time_s 0 is not a positive"),
    ('{"step": 0, "step_time_s": 0.1, "loss": "low", "tokens": 8}', "loss 'low' is not a number"),
    ('{"step": 0, "step_time_s": 0.1, "loss": 1, "tokens": 8}\n{"step": 0, "step_time_s": 0.1, '
     '"loss": 1, "tokens": 8}', "line 2: step 0 repeats step 0"),
    ('not json', "line 1: not JSON"), ('[1, 2]', "line 1: not a JSON object"),
])
def test_parse_steps_names_the_first_problem(text, problem):
    _, found = parse_steps(text)
    assert found and problem in found, found


# --- what the runner records from a command's metrics --------------------------------------

def _write(run: Path, records):
    run.mkdir(parents=True, exist_ok=True)
    (run / "steps.jsonl").write_text(contract.steps_text(records))


def test_collect_writes_the_builtin_summary_keys(tmp_path):
    p = point()
    tokens = p.tokens_per_step
    _write(tmp_path, [contract.step_record(i, t, 3.0 - i, tokens)
                      for i, t in enumerate([0.9, 0.2, 0.3, 0.25])])
    assert collect.command_record(p, tmp_path, tmp_path / "stdout.log", wall_s=5.0) is None
    steps = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [s["warmup"] for s in steps] == [True, False, False, False]
    s = json.loads((tmp_path / "summary.json").read_text())
    builtin_keys = {
        "point_id", "config_hash", "repeat", "n_params", "steps", "warmup_steps", "loss_first",
        "loss_last", "loss_noise_floor", "tokens_per_step", "step_time_median_s",
        "tokens_per_s", "model_flops_per_step", "hardware_flops_per_step", "device_type",
        "device_name", "hardware", "dtype", "peak_flops_per_device", "peak_source",
        "peak_memory_bytes", "memory_kind", "train_wall_s", "workload"}
    assert builtin_keys <= set(s) and s["metrics"] == "steps_jsonl"
    assert s["step_time_median_s"] == 0.25 and s["tokens_per_s"] == tokens / 0.25
    assert s["model_flops_per_step"] == flops.flops_table(MODEL, p.global_batch)["model"]
    assert s["n_params"] == flops.param_count(MODEL) and s["loss_last"] == 0.0


@pytest.mark.parametrize("records, problem", [
    (None, "the command wrote no steps.jsonl into $SCALESTUDY_POINT_DIR"),
    ([(0, 0.1)] * 1, "steps.jsonl has 1 steps, the point trains 4: pass {steps}"),
    ("tokens", "steps.jsonl: step 0 trained 7 tokens, the point trains 64 per step"),
])
def test_missing_or_foreign_metrics_are_invalid_with_the_reason(tmp_path, records, problem):
    p = point()
    if records == "tokens":
        _write(tmp_path, [contract.step_record(i, 0.1, 1.0, 7) for i in range(4)])
    elif records is not None:
        _write(tmp_path, [contract.step_record(i, t, 1.0, 64) for i, t in records])
    reason = collect.command_record(p, tmp_path, tmp_path / "stdout.log", wall_s=1.0)
    assert reason.startswith("metrics: ") and problem in reason, reason
    assert not (tmp_path / "summary.json").exists()


def test_flops_from_the_shape_a_stated_value_or_none(tmp_path):
    shape = point()
    stated = point(flops_per_token=1e6, precision="bf16")
    unknown = point(flops_per_token="unknown", precision="bf16")
    table = flops.point_flops_table
    assert table(shape) == flops.flops_table(MODEL, 4, "none")
    assert table(stated)["model"] == {"megatron": 64e6, "palm": 64e6}
    assert table(stated)["hardware"] == {"megatron": None, "palm": None}
    assert table(unknown) == {"model": {"megatron": None, "palm": None},
                              "hardware": {"megatron": None, "palm": None}}
    # through the runs.csv row: MFU on an H100 with a stated value, empty when unknown
    from conftest import run_row

    for name, p in (("stated", stated), ("unknown", unknown)):
        p = p.replace(platform=p.platform.__class__(device="cpu", hardware="H100-SXM5"))
        run = tmp_path / name
        _write(run, [contract.step_record(i, 0.5, 1.0, 64) for i in range(4)])
        (run / "point.json").write_text(p.json_text())
        assert collect.command_record(p, run, run / "stdout.log", wall_s=1.0) is None
        (run / "status.json").write_text(json.dumps({"state": "ok", "reason": ""}))
        row, _, _ = run_row({"point_id": "p", "tokens_per_step": 64, "n": 2, "feasible": True,
                             "precision": "bf16"}, run, None, "megatron")
        assert row["peak_tflops"] > 0
        if name == "stated":
            assert row["model_flops_per_step"] == 64e6
            assert row["mfu"] == pytest.approx(64e6 / (0.5 * 2 * row["peak_tflops"] * 1e12))
            assert math.isnan(row["hfu"])
        else:
            assert math.isnan(row["model_flops_per_step"]) and math.isnan(row["mfu"])
        # no summary (a failed run): the point's own FLOPs, the same answer
        (run / "summary.json").unlink()
        row, _, _ = run_row({"point_id": "p", "tokens_per_step": 64, "n": 2, "feasible": True,
                             "precision": "bf16"}, run, None, "megatron")
        assert (row["model_flops_per_step"] == 64e6) if name == "stated" else math.isnan(
            row["model_flops_per_step"])
