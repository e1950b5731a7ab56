"""The report of a layout search (``report.tune``) on a trials.csv written by hand, its
section in the study's summary.md, and the record's checker (``record.trials``)."""

import math

import pandas as pd
import pytest
from synthetic_study import make_study

from scalestudy.record.bounded_read import RecordError
from scalestudy.record.trials import TRIAL_COLUMNS, best_complete, check_trials, read_trials
from scalestudy.report import tune as rtune
from scalestudy.report.aggregate import aggregate_study

N = 4


def _row(trial, tp, pp, mb, steps, state, measured, predicted, *, warm=False, reused=False,
         wall=36.0, memory=1.5):
    name = f"tp{tp}-pp{pp}-mb{mb}-ddp-acnone"
    ran = state not in ("refused", "duplicate")
    return {"trial": trial, "layout": name, "tp": tp, "pp": pp, "cp": 1, "dp": N // (tp * pp),
            "micro_batch": mb, "pp_schedule": "1f1b", "virtual_stages": 1, "dp_mode": "ddp",
            "activation_checkpointing": "none", "steps": steps if ran else math.nan,
            "fidelity": steps / 12 if ran else math.nan, "state": state,
            "reason": "" if state in ("complete", "promoted") else f"{state} here",
            "predicted_tokens_per_s_per_device": predicted,
            "measured_tokens_per_s_per_device": measured,
            "peak_memory_gb": memory if ran else math.nan,
            "wall_s": wall if ran and not reused else 0.0,
            "device_hours": wall * N / 3600 if ran and not reused else 0.0,
            "warm_start": warm, "reused": reused or not ran,
            "point_id": f"{name}_n{N}_s{steps}" if ran else ""}


def trials_table() -> pd.DataFrame:
    """Optuna's trial numbers (from 0): two warm starts (the model's pick completes at 1200,
    the other is the best at 1850), a pruned layout, a refusal, an oom, and a reused
    full-length record."""
    rows = [
        _row(0, 1, 1, 4, 4, "promoted", 1100.0, 1400.0, warm=True),
        _row(1, 2, 1, 2, 4, "promoted", 1500.0, 1300.0, warm=True),
        _row(2, 1, 2, 2, 4, "pruned", 400.0, 900.0),
        _row(3, 4, 1, 8, 4, "refused", math.nan, math.nan),
        _row(0, 1, 1, 4, 12, "complete", 1200.0, 1400.0, warm=True),
        _row(1, 2, 1, 2, 12, "complete", 1850.5, 1300.0, warm=True, memory=2.25),
        _row(4, 1, 4, 1, 4, "oom", math.nan, 800.0),
        _row(5, 2, 2, 1, 12, "complete", 950.0, 1000.0, reused=True),
    ]
    return pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))


def _write(study_dir, df):
    path = study_dir / "tune" / "trials.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


def _png_ok(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_report_figure_and_markdown(tmp_path):
    _write(tmp_path, trials_table())
    paths = rtune.write_tune_report(tmp_path, exhaustive_best=(1900.0, 1800.0, 2000.0))
    assert [p.name for p in paths] == ["convergence.png", "convergence.pdf", "summary.md"]
    assert sorted(p.name for p in (tmp_path / "tune").iterdir()) == [
        "convergence.pdf", "convergence.png", "summary.md", "trials.csv"]  # no temp left
    assert _png_ok(tmp_path / "tune" / "convergence.png")
    assert (tmp_path / "tune" / "convergence.pdf").read_bytes()[:4] == b"%PDF"
    text = (tmp_path / "tune" / "summary.md").read_text()
    assert text.startswith("## Tuning\n")
    # 6 trials; 5 layouts ran (the refused one did not) in 7 runs, 1 reused;
    # 6 runs of 36 s on 4 devices = 0.24 device-hours
    assert "6 trials, 5 layouts measured in 7 runs (1 reused from earlier records), " \
           "0.24 device-hours" in text
    assert "- Best layout: `tp2-pp1-mb2-ddp-acnone` (trial 1, dp 2): 1850 tokens/s per " \
           "device measured, 1300 predicted." in text
    assert "- Model-only pick (trial 0, the first warm start): `tp1-pp1-mb4-ddp-acnone`: " \
           "1200 tokens/s per device measured, 1400 predicted; best / model pick = 1.542." in text
    assert "complete 3, promoted 2, pruned 1, refused 1, oom 1" in text
    table = [line for line in text.splitlines() if line.startswith("| ") and "`" in line]
    assert [line.split(" | ")[2] for line in table] == [
        "`tp2-pp1-mb2-ddp-acnone`", "`tp1-pp1-mb4-ddp-acnone`", "`tp2-pp2-mb1-ddp-acnone`"]
    assert table[0].endswith("| 1850 | 1300 | 2.25 |")
    assert "best.yaml" not in text


def test_figure_styles_and_exhaustive_forms(tmp_path):
    df = trials_table()
    for style, best in (("single-column", 1900.0), ("double-column", None)):
        paths = rtune.convergence_figure(df, tmp_path / style, best, style)
        assert all(p.stat().st_size > 0 for p in paths)
    paths = rtune.convergence_figure(df.iloc[0:0], tmp_path / "empty")  # no trial yet
    assert all(p.stat().st_size > 0 for p in paths)


def test_no_complete_trial_and_best_study(tmp_path):
    df = trials_table()
    df = df[df["state"] != "complete"]
    assert best_complete(df) is None
    text = rtune.tune_markdown(df, "s", best_study_path="best.yaml")
    assert "- Best layout: none; no trial completed at full length." in text
    assert "`tp1-pp1-mb4-ddp-acnone`: promoted, no full-length measurement" in text
    assert "- The best layout as a study to run: `best.yaml`." in text
    assert "| # |" not in text


def test_summary_gains_the_section_only_with_trials(tmp_path):
    d = make_study(tmp_path)
    aggregate_study(d)
    assert "## Tuning" not in (d / "summary.md").read_text()
    _write(d, trials_table())
    (d / "tune" / "best.yaml").write_text("name: best\n")
    aggregate_study(d)
    text = (d / "summary.md").read_text()
    section = text[text.index("## Tuning"):]
    assert section == rtune.tune_markdown(read_trials(d / "tune" / "trials.csv"), "synth",
                                          "tune/best.yaml")


def test_damaged_trials_in_summary_is_a_note(tmp_path, capsys):
    d = make_study(tmp_path)
    df = trials_table()
    df.loc[2, "state"] = "lost"
    _write(d, df)
    aggregate_study(d)
    text = (d / "summary.md").read_text()
    assert "## Tuning" not in text and "trials.csv row 4: state 'lost'" in text
    assert "trials.csv row 4" in capsys.readouterr().err


@pytest.mark.parametrize("damage, column", [
    (lambda df: df.assign(state=df["state"].replace("oom", "exploded")), "state"),
    (lambda df: df.assign(measured_tokens_per_s_per_device=-df[
        "measured_tokens_per_s_per_device"]), "measured_tokens_per_s_per_device"),
    (lambda df: df.drop(columns=["peak_memory_gb"]), "peak_memory_gb"),
    (lambda df: df.assign(fidelity=df["fidelity"] * 2), "fidelity"),
    (lambda df: df.assign(tp=0), "tp"),
])
def test_damaged_trials_are_one_line_errors(tmp_path, damage, column):
    _write(tmp_path, damage(trials_table()))
    with pytest.raises(RecordError, match=column) as e:
        rtune.write_tune_report(tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "tune" / "convergence.png").exists()


def test_missing_trials_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="scalestudy tune STUDY --measure"):
        rtune.write_tune_report(tmp_path)


def test_check_trials():
    df = trials_table()
    assert check_trials(df) is df
    with pytest.raises(RecordError, match="no column reused, point_id"):
        check_trials(df.drop(columns=["reused", "point_id"]))
    bad = df.copy()
    bad.loc[5, "device_hours"] = math.inf
    with pytest.raises(RecordError, match=r"row 7: device_hours inf"):
        check_trials(bad)
    bad = df.astype({"micro_batch": float})
    bad.loc[0, "micro_batch"] = 1.5
    with pytest.raises(RecordError, match=r"row 2: micro_batch 1.5"):
        check_trials(bad)
    with pytest.raises(RecordError, match=r"row 2: trial -1"):
        check_trials(df.assign(trial=df["trial"] - 1))
    # a refused or failed evaluation has no measurement, a refused one no steps (and no dp
    # when its shape does not divide N): empty cells are sound
    odd = df.astype({"dp": float})
    odd.loc[3, "dp"] = math.nan
    assert check_trials(odd[odd["state"].isin(["refused", "oom"])]) is not None
