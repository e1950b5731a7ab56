"""aggregate on a synthetic study directory with known answers (ok, failed, infeasible and
not-run points; two repeats)."""

import json

import numpy as np
import pandas as pd
import pytest
from conftest import run_row
from synthetic_study import CEILING, MODEL, POINTS, make_study

from scalestudy.analysis import aggregate
from scalestudy.report.aggregate import aggregate_study
from scalestudy.config import flops
from scalestudy.record.run_records import read_steps
from scalestudy.record.io import write_json
from scalestudy import cli


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    d = make_study(tmp_path_factory.mktemp("agg"))
    aggregate_study(d)
    return d


def test_runs_table_one_row_per_planned_run(study):
    runs = pd.read_csv(study / "runs.csv")
    assert len(runs) == sum(len(p[5]) for p in POINTS)
    assert pd.read_parquet(study / "runs.parquet").shape == runs.shape
    assert runs["status"].value_counts().to_dict() == {"ok": 10, "oom": 2, "infeasible": 2,
                                                       "not_run": 1, "timeout": 1}
    assert set(aggregate.RUN_COLUMNS) <= set(runs.columns)
    inf = runs[runs["status"] == "infeasible"]
    assert inf["reason"].str.contains("9.9 GB").all()
    assert runs.loc[runs["status"] == "not_run", "reason"].str.contains("status.json").all()
    assert (runs["study"] == "synth").all()


def test_runs_numbers(study):
    runs = pd.read_csv(study / "runs.csv").set_index("point_id")
    r = runs.loc["strong-dp_n2_dp2-tp1-pp1_gb16_abcd0002_r0"]
    assert r["step_time_median_s"] == pytest.approx(0.4)  # warm-up steps (2.0, 1.2) dropped
    assert r["n_steady_steps"] == 8
    assert r["step_time_ci_lo_s"] <= 0.4 <= r["step_time_ci_hi_s"]
    assert r["step_time_q25_s"] < 0.4 < r["step_time_q75_s"]
    assert r["tokens_per_s"] == pytest.approx(16 * 64 / 0.4)
    assert r["tokens_per_s_per_device"] == pytest.approx(16 * 64 / 0.4 / 2)
    mf = flops.model_flops_per_step(MODEL, 16, "megatron")
    assert r["model_tflops_per_device"] == pytest.approx(mf / 0.4 / 2 / 1e12, rel=1e-5)
    assert r["flops_convention"] == "megatron"
    # CPU: no spec peak -> no MFU; utilisation against the measured ceiling instead
    assert np.isnan(r["mfu"]) and np.isnan(r["peak_tflops"])
    assert r["util_vs_measured_ceiling"] == pytest.approx(mf / 0.4 / 2 / CEILING, rel=1e-5)
    assert r["loss_first"] == 5.5 and r["loss_last"] == 2.8
    oom = runs[runs["status"] == "oom"].iloc[0]
    assert np.isnan(oom["step_time_median_s"]) and oom["reason"] == "oom at step 3"
    # FLOPs are known from the config even for a run that failed
    assert oom["model_flops_per_step"] > 0


def test_efficiency_known_answers(study):
    e = pd.read_csv(study / "efficiency.csv")
    weak = e[e["series"] == "weak-dp"].set_index("n")
    strong = e[e["series"] == "strong-dp"].set_index("n")
    assert weak.loc[[1, 2, 4], "efficiency"].tolist() == pytest.approx([1, 1, 0.8])
    assert strong.loc[[1, 2, 4], "efficiency"].tolist() == pytest.approx([1, 1, 0.8])
    assert strong.loc[[1, 2, 4], "speedup"].tolist() == pytest.approx([1, 2, 3.2])
    assert weak.loc[8, "status"] == "oom" and np.isnan(weak.loc[8, "efficiency"])
    assert strong.loc[8, "status"] == "infeasible"
    assert (e.loc[e["n"] == 1, "efficiency"] == 1).all()  # efficiency at N0 is 1
    ok = e[e["status"] == "ok"]
    assert (ok["efficiency_ci_lo"] <= ok["efficiency"] + 1e-12).all()
    assert (ok["efficiency"] <= ok["efficiency_ci_hi"] + 1e-12).all()
    assert weak.loc[4, "n_ok"] == 1 and weak.loc[4, "n_repeats"] == 2
    assert strong.loc[4, "n_ok"] == 1 and "timeout" in strong.loc[4, "reason"]


def test_summary_markdown(study):
    text = (study / "summary.md").read_text()
    assert "| series | mode | N |" in text
    assert "CPU/gloo runs test correctness and communication volume, not cluster communication time" in text
    assert "megatron" in text and "measured matmul ceiling" in text
    assert "No spec peak" in text
    assert "oom" in text and "infeasible" in text


def test_broken_invariant_gets_no_curve(tmp_path, capsys):
    d = make_study(tmp_path, break_invariant=True, calibration=False)
    aggregate_study(d)
    e = pd.read_csv(d / "efficiency.csv")
    strong = e[e["series"] == "strong-dp"]
    assert strong["efficiency"].isna().all()
    assert strong["note"].str.contains("invariant broken").all()
    assert e.loc[e["series"] == "weak-dp", "efficiency"].notna().sum() == 3
    err = capsys.readouterr().err
    assert "strong-dp" in err and "tokens per step" in err
    assert "no efficiency curve" in (d / "summary.md").read_text()
    runs = pd.read_csv(d / "runs.csv")
    assert runs["util_vs_measured_ceiling"].isna().all()  # no calibration.json


def test_missing_plan_is_a_clear_error(tmp_path, capsys):
    from scalestudy.record.bounded_read import RecordError

    with pytest.raises(RecordError, match="plan.tsv"):
        aggregate_study(tmp_path)
    assert cli.main(["aggregate", str(tmp_path / "nonexistent")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such study folder" in err


def test_spec_peak_gives_mfu(tmp_path):
    peak = ("H200-SXM", 1e12, "test peak")
    d = make_study(tmp_path, peak=peak)
    aggregate_study(d)
    runs = pd.read_csv(d / "runs.csv").set_index("point_id")
    r = runs.loc["strong-dp_n2_dp2-tp1-pp1_gb16_abcd0002_r0"]
    mf = flops.model_flops_per_step(MODEL, 16, "megatron")
    assert r["mfu"] == pytest.approx(mf / 0.4 / 2 / 1e12, rel=1e-5)
    assert r["hfu"] == pytest.approx(r["mfu"], rel=1e-12)  # no recompute
    assert r["peak_tflops"] == 1.0 and r["peak_source"] == "test peak"
    text = (d / "summary.md").read_text()
    assert "| MFU |" in text and "H200-SXM" in text and "CPU/gloo" not in text


def test_ok_without_steps_is_invalid_and_unknown_state_too(tmp_path):
    d = make_study(tmp_path)
    run_dir = d / "runs" / "weak-dp_n2_dp2-tp1-pp1_gb8_abcd0002_r1"
    (run_dir / "steps.jsonl").unlink()
    other = d / "runs" / "weak-dp_n1_dp1-tp1-pp1_gb4_abcd0001_r1"
    write_json(other / "status.json", {"state": "exploded", "reason": "?"})
    runs, e, _ = aggregate.collect(d)
    r = runs.set_index("point_id")
    assert r.loc[run_dir.name, "status"] == "invalid" and "steps.jsonl" in r.loc[run_dir.name, "reason"]
    assert r.loc[other.name, "status"] == "invalid" and "exploded" in r.loc[other.name, "reason"]
    # the other repeat still carries the point: efficiency is unchanged
    weak = e[e["series"] == "weak-dp"].set_index("n")
    assert weak.loc[2, "n_ok"] == 1 and weak.loc[2, "efficiency"] == pytest.approx(1.0)


def test_run_cis_equal_the_per_run_bootstrap(study):
    # runs.csv's CI comes from the batched bootstrap: identical to bootstrapping each run alone
    from scalestudy.analysis import stats

    runs = pd.read_csv(study / "runs.csv").set_index("point_id")
    ok = runs[runs["status"] == "ok"]
    assert len(ok) >= 5
    for pid in ok.index[:5]:
        times = aggregate.steady_times(read_steps(study / "runs" / pid / "steps.jsonl")[0])
        dist = stats.bootstrap_medians(times.tolist(), seed=aggregate._seed(pid))
        lo, hi = stats.percentile_ci(dist)
        assert ok.loc[pid, "step_time_ci_lo_s"] == pytest.approx(lo, rel=1e-5)  # csv: 6 digits
        assert ok.loc[pid, "step_time_ci_hi_s"] == pytest.approx(hi, rel=1e-5)
    rows, _, ctx = aggregate.collect(study)
    r = rows.set_index("point_id")
    for pid in ok.index[:5]:
        row, times, dist = run_row(
            {**r.loc[pid].to_dict(), "point_id": pid, "feasible": True}, study / "runs" / pid,
            ctx["calibration"], ctx["convention"])
        for c in ("step_time_median_s", "step_time_ci_lo_s", "step_time_ci_hi_s", "mfu",
                  "util_vs_measured_ceiling", "tokens_per_s_per_device"):
            assert np.array_equal(row[c], r.loc[pid, c], equal_nan=True), c


def test_a_foreign_point_json_makes_the_run_invalid(tmp_path):
    # another study's point.json (another id and hash) in a run folder is not read as its own
    d = make_study(tmp_path)
    pid = "weak-dp_n2_dp2-tp1-pp1_gb8_abcd0002_r0"
    other = "weak-dp_n1_dp1-tp1-pp1_gb4_abcd0001_r0"
    (d / "runs" / pid / "point.json").write_bytes((d / "runs" / other / "point.json").read_bytes())
    runs, e, _ = aggregate.collect(d)
    r = runs.set_index("point_id").loc[pid]
    assert r["status"] == "invalid" and "foreign record" in r["reason"]
    assert np.isnan(r["step_time_median_s"]) and np.isnan(r["mfu"])


def test_study_convention_applies_to_every_row(tmp_path):
    # a point.json left from before the study switched convention does not mix conventions
    d = make_study(tmp_path)
    pid = "weak-dp_n2_dp2-tp1-pp1_gb8_abcd0002_r0"
    point = json.loads((d / "runs" / pid / "point.json").read_text())
    write_json(d / "runs" / pid / "point.json", dict(point, flops_convention="palm"))
    runs, _, ctx = aggregate.collect(d)
    assert ctx["convention"] == "megatron" and (runs["flops_convention"] == "megatron").all()
    mf = flops.model_flops_per_step(MODEL, 8, "megatron")
    assert runs.set_index("point_id").loc[pid, "model_flops_per_step"] == pytest.approx(mf)
