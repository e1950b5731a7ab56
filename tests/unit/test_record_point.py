"""A run's records checked against its point (``scalestudy.record.against_point``: ``point_facts``,
``step_vs_point``, ``summary_vs_point``, ``env_vs_point``) and a diverged loss written as valid
JSON (``scalestudy.record.steps``' ``loss_nonfinite`` marker) that the reader refuses."""

from __future__ import annotations

import json
import math

import pytest

from scalestudy.config.point import Point
from scalestudy.config.parts import Model
from scalestudy.config.identity import identify
from scalestudy.record.run_summary import summary as run_summary
from scalestudy.record import run_records as read
from scalestudy.record import against_point
from scalestudy.record.bounded_read import RecordError
from scalestudy.record import steps as contract

MODEL = Model(name="m", layers=2, hidden=32, heads=2, seq_len=64, vocab=64)
#: n = 4 = dp 2 x tp 2; global batch 16 sequences of 64 tokens: 1024 tokens per step
POINT = identify(Point.for_layout(MODEL, dp=2, tp=2, micro_batch=8, device="cpu", steps=6,
                                  warmup_steps=2, series="s", mode="weak"))
FACTS = against_point.point_facts(POINT.to_json())


def test_facts_are_the_points_batch_arithmetic():
    assert (FACTS.steps, FACTS.global_batch, FACTS.seq_len, FACTS.n) == (6, 16, 64, 4)
    assert FACTS.tokens_per_step == POINT.tokens_per_step == 1024
    assert dict(FACTS.layout) == {"dp": 2, "tp": 2, "pp": 1, "cp": 1}
    assert against_point.point_facts(None) is None and against_point.point_facts({}) is None
    # a field of another type is unknown (check_point names it), never an exception
    assert against_point.point_facts({"n": "four", "model": [], "train": 3}).n is None


def test_a_step_is_checked_against_the_points_tokens_batch_and_ranks():
    good = contract.step_record(3, 0.1, 2.0, 1024)
    assert against_point.step_vs_point(good, FACTS) is None
    assert against_point.step_vs_point(dict(good, tokens=512), FACTS) == (
        "steps.jsonl: step 3 trained 512 tokens, the point trains 1024 per step "
        "(global_batch 16 x seq_len 64)")
    assert "states seq_len 32, the point's is 64" in against_point.step_vs_point(dict(good, seq_len=32),
                                                                        FACTS)
    assert "global_batch 8" in against_point.step_vs_point(dict(good, global_batch=8), FACTS)
    assert against_point.step_vs_point(dict(good, rank_energy_j=[1.0] * 4), FACTS) is None
    assert against_point.step_vs_point(dict(good, rank_energy_j=[1.0] * 2), FACTS) == (
        "steps.jsonl: step 3 has rank_energy_j of 2 rank(s), the point runs on n=4")
    # unknown facts check nothing
    assert against_point.step_vs_point(dict(good, tokens=1), against_point.PointFacts()) is None


def test_read_steps_refuses_a_file_with_half_the_tokens(tmp_path):
    recs = [contract.step_record(i, 0.1, 2.0, 1024 if i != 4 else 512) for i in range(6)]
    contract.write_steps(tmp_path, recs)
    steps, why = read.read_steps(tmp_path / "steps.jsonl", point=POINT.to_json())
    assert steps is None and why.startswith("steps.jsonl: step 4 trained 512 tokens")
    # without the point only the contract is checked
    assert read.read_steps(tmp_path / "steps.jsonl")[1] is None
    # the point also gives the step count
    contract.write_steps(tmp_path, recs[:3])
    assert "3 steps, the point trains 6" in read.read_steps(tmp_path / "steps.jsonl",
                                                            point=POINT.to_json())[1]


def _summary(**changes) -> dict:
    recs = [contract.step_record(i, 0.1, 3.0 - 0.1 * i, 1024, warmup=i < 2) for i in range(6)]
    s = run_summary(POINT, recs, device_type="cpu", device_name="x", peak_memory_bytes=1,
                    memory_kind="k", train_wall_s=1.0)
    return read.check_summary(json.loads(json.dumps(s, default=str)) | changes)


def test_a_summary_is_checked_against_the_point():
    assert against_point.summary_vs_point(_summary(), FACTS) is None
    assert against_point.summary_vs_point(_summary(tokens_per_step=512), FACTS) == (
        "summary.json: tokens_per_step 512, the point trains 1024 (global_batch 16 x seq_len 64)")
    assert against_point.summary_vs_point(_summary(steps=5), FACTS) == (
        "summary.json: 5 steps, the point trains 6 (train.steps)")
    assert against_point.summary_vs_point(_summary(world_size=2), FACTS) == (
        "summary.json: world_size 2, the point runs on n=4")
    assert against_point.summary_vs_point(_summary(layout={"dp": 4, "tp": 1}), FACTS) == (
        "summary.json: layout dp=4, the point's is dp=2 (dp=2 tp=2 pp=1 cp=1)")
    assert against_point.summary_vs_point(_summary(layout={"dp": 2, "tp": 2}), FACTS) is None


def test_an_env_is_checked_against_the_points_world_and_layout():
    env = {"world_size": 4, "ranks": [{}] * 4, "layout": {"dp": 2, "tp": 2, "pp": 1, "cp": 1}}
    assert against_point.env_vs_point(read.check_env(env), FACTS) is None
    assert against_point.env_vs_point(dict(env, world_size=2), FACTS) == (
        "env.json: world_size 2, the point runs on n=4 ranks")
    assert against_point.env_vs_point(dict(env, ranks=[{}]), FACTS) == (
        "env.json: 1 ranks recorded, the point runs on n=4")
    assert against_point.env_vs_point(dict(env, layout={"dp": 1, "tp": 4, "pp": 1}), FACTS).startswith(
        "env.json: layout dp=1, the point's is dp=2")
    with pytest.raises(RecordError, match="layout .* is not a table of whole numbers"):
        read.check_env(dict(env, layout={"dp": 1.5}))


@pytest.mark.parametrize("loss, mark", [(math.nan, "nan"), (math.inf, "inf"),
                                        (-math.inf, "-inf")])
def test_a_nonfinite_loss_is_valid_json_and_a_diverged_run(tmp_path, loss, mark):
    recs = [contract.step_record(i, 0.1, 3.0 if i < 3 else loss, 1024, warmup=i < 2)
            for i in range(6)]
    assert recs[3] == {"step": 3, "step_time_s": 0.1, "loss": None, "loss_nonfinite": mark,
                       "tokens": 1024, "warmup": False}
    text = contract.steps_text(recs)
    assert "NaN" not in text and "Infinity" not in text
    why = f"loss diverged: non-finite loss ({mark}) at step 3"
    assert read.parse_steps(text) == (recs[:3], why)
    s = run_summary(POINT, recs, device_type="cpu", device_name="x", peak_memory_bytes=1,
                    memory_kind="k", train_wall_s=1.0)
    s = json.loads(json.dumps(s, default=str, allow_nan=False))  # valid JSON, no NaN literal
    assert (s["loss_nonfinite"], s["loss_nonfinite_step"], s["loss_last"]) == (mark, 3, 3.0)
    assert against_point.summary_vs_point(read.check_summary(s), FACTS) == why
    # ranks merged: one rank's divergence is the step's
    other = [contract.step_record(i, 0.1, 2.0, 1024) for i in range(6)]
    merged = contract.merge_ranks([other, recs])
    assert merged[2]["loss"] == 2.5 and merged[3]["loss_nonfinite"] == mark
    # a NaN literal left by another writer reads the same
    assert read.parse_steps('{"step": 0, "step_time_s": 0.1, "loss": NaN, "tokens": 1}\n')[1] \
        == "loss diverged: non-finite loss (nan) at step 0"
    assert "loss_nonfinite 'big' is not nan, inf or -inf" in read.parse_steps(
        '{"step": 0, "step_time_s": 0.1, "loss": null, "loss_nonfinite": "big", "tokens": 1}\n')[1]
