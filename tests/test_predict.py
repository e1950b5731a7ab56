"""scalestudy predict: Frontier configurations at scale vs the published figures."""

import pandas as pd
import pytest

from scalestudy.perf import stepmodel as perfmodel
from scalestudy.perf import predict


def test_series_shapes():
    cfgs = predict.reference("frontier_dash2024_configs")
    pub = predict.reference("frontier_dash2024")
    chosen = predict.pick_configs(cfgs, pub)
    assert set(chosen) == {"gpt-22b", "gpt-175b", "gpt-1t"}
    s = predict.series_points(chosen["gpt-1t"], 3072)
    assert [p.n for p in s["weak"]] == [1024, 2048, 3072]
    assert len({p.global_batch for p in s["strong"]}) == 1
    assert len({p.tp * p.pp * p.micro_batch * p.grad_accum for p in s["weak"]}) == 1
    for p in s["strong"]:
        assert p.global_batch == p.dp * p.micro_batch * p.grad_accum
    assert {p.mode for p in s["weak"]} == {"weak"} and {p.mode for p in s["strong"]} == {"strong"}


def test_predict_vs_published(tmp_path):
    assert predict.main(["--hardware", "frontier", "--out", str(tmp_path)]) == 0
    comp = pd.read_csv(tmp_path / "predict_vs_published.csv")
    assert set(comp["model"]) == {"gpt-22b", "gpt-175b", "gpt-1t"}
    assert len(comp) == 10
    row = comp[comp["rel_error"].notna()]
    assert ((row["predicted"] - row["published"]) / row["published"]).round(9).equals(row["rel_error"].round(9))
    pct = comp[comp["metric"].str.startswith("% of peak")].set_index("model")["predicted"]
    assert pct["gpt-22b"] > pct["gpt-175b"] > pct["gpt-1t"]  # the published ordering
    weak = comp[comp["metric"].str.startswith("weak")]
    assert (weak["predicted"] > 99).all()
    strong = comp[comp["metric"].str.startswith("strong")]
    assert ((strong["predicted"] > 50) & (strong["predicted"] < 100)).all()
    for f in ("predict_points.csv", "predict_vs_published.md", "predict_mfu.png", "predict_scaling.png"):
        assert (tmp_path / f).stat().st_size > 0


def test_measured_matmul_changes_compute(tmp_path):
    mm = tmp_path / "mm.csv"
    pd.DataFrame([{"dtype": "bf16", "m": 2048, "n": 2048, "k": 2048, "sample": 0,
                   "flops_per_s": 95.75e12}]).to_csv(mm, index=False)
    hw = perfmodel.HardwareSpec.load("frontier")
    d, _ = predict.run(hw)
    m, _ = predict.run(hw, perfmodel.Measured.from_csv(str(mm)))
    a, b = (x[x["series"] == "mfu"].set_index("model") for x in (d, m))
    assert (b["matmul_rate_source"] == "measured").all()
    assert b["matmul_flops_per_s"].tolist() == pytest.approx([95.75e12] * 3)


def test_study_points_and_residuals(tmp_path):
    """A study's own points: predicted on cpu-local, set against a runs.csv."""
    from pathlib import Path

    study = Path(__file__).resolve().parents[1] / "workflow" / "config" / "default.yaml"
    out = tmp_path / "out"
    assert predict.main([str(study), "--results", str(tmp_path), "--out", str(out)]) == 0
    pred = pd.read_csv(out / "study_predictions.csv")
    assert len(pred) == pred["config_hash"].nunique() > 0
    assert (pred["hardware"] == "cpu-local").all()
    base = pred[pred["n"] == pred["baseline_n"]]
    assert (base["predicted_efficiency"] == 1.0).all()
    # a runs.csv whose measured times are 10% above the predictions, two ok repeats each,
    # plus a crashed repeat that must be ignored
    runs = pd.concat([
        pred.assign(status="ok", step_time_median_s=pred["step_time_s"] * 1.1),
        pred.assign(status="ok", step_time_median_s=pred["step_time_s"] * 1.1),
        pred.assign(status="crashed", step_time_median_s=pred["step_time_s"] * 100),
    ])[["config_hash", "status", "step_time_median_s"]]
    runs.to_csv(tmp_path / "runs.csv", index=False)
    assert predict.main([str(study), "--results", str(tmp_path), "--out", str(out),
                         "--runs", str(tmp_path / "runs.csv")]) == 0
    vm = pd.read_csv(out / "predict_vs_measured.csv")
    assert vm["residual"].round(6).eq(round(1 / 1.1 - 1, 6)).all()
    assert (out / "predict_vs_measured.png").stat().st_size > 0
