"""Figures on synthetic study directories (ok, failed and infeasible points)."""

import pandas as pd
import pytest

from scalestudy.report.aggregate import aggregate_study
from scalestudy.report import plots
from synthetic_study import make_study

EXPECTED = {f"{f}.{e}" for f in plots.FIGURES for e in ("png", "pdf", "csv")}


def _png_ok(path):
    data = path.read_bytes()
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.fixture(scope="module")
def plotted(tmp_path_factory):
    d = make_study(tmp_path_factory.mktemp("plots"))
    aggregate_study(d)
    return d, plots.run(d)


def test_all_figures_with_reference_overlay(plotted):
    d, paths = plotted
    assert {p.name for p in paths} == EXPECTED
    assert {p.name for p in (d / "figures").iterdir()} == EXPECTED  # no temp files left
    assert all(_png_ok(p) for p in paths if p.suffix == ".png")
    assert all(p.read_bytes()[:4] == b"%PDF" for p in paths if p.suffix == ".pdf")
    weak = pd.read_csv(d / "figures" / "efficiency_weak.csv")
    # measured rows (failed ones included, so the CSV shows where scaling broke) + references
    assert weak.loc[weak["kind"] == "measured", "status"].tolist() == ["ok", "ok", "ok", "oom"]
    ref = weak[weak["kind"] == "reference"]
    assert set(ref["n"]) == {1024, 3072} and (ref["efficiency"] == 1.0).all()
    strong = pd.read_csv(d / "figures" / "efficiency_strong.csv")
    assert "infeasible" in set(strong["status"])
    # CPU: no spec peak -> the utilisation figure uses the measured ceiling, no published % of peak
    mfu = pd.read_csv(d / "figures" / "mfu.csv")
    assert "util_vs_measured_ceiling" in mfu.columns and (mfu["kind"] == "measured").all()


def test_mfu_figure_overlays_published_percent_of_peak(tmp_path):
    d = make_study(tmp_path, peak=("H200-SXM", 1e12, "test"))
    aggregate_study(d)
    eff, runs = pd.read_csv(d / "efficiency.csv"), pd.read_csv(d / "runs.csv")
    paths = plots.mfu_figure(eff, runs, tmp_path, ["frontier_dash2024"])
    assert [p.name for p in paths] == ["mfu.png", "mfu.pdf", "mfu.csv"]
    mfu = pd.read_csv(tmp_path / "mfu.csv")
    assert mfu["mfu"].notna().any()
    assert mfu.loc[mfu["kind"] == "reference", "mfu"].tolist() == pytest.approx([0.3838, 0.3614, 0.3196])


def test_no_reference_and_a_broken_series(tmp_path):
    d = make_study(tmp_path, references=(), break_invariant=True, calibration=False)
    aggregate_study(d)
    eff, runs = pd.read_csv(d / "efficiency.csv"), pd.read_csv(d / "runs.csv")
    plots.efficiency_figure(eff, runs, "strong", tmp_path, [])
    strong = pd.read_csv(tmp_path / "efficiency_strong.csv")
    assert "kind" in strong.columns and (strong["kind"] == "measured").all()
    assert strong["efficiency"].isna().all()


def test_missing_tables_and_unknown_reference(tmp_path, plotted):
    with pytest.raises(FileNotFoundError, match="aggregate"):
        plots.run(tmp_path)
    d, _ = plotted
    with pytest.raises(ValueError, match="references: 'nope'"):
        plots.run(d, references=["nope"])


def test_a_study_without_strong_series_still_gets_every_file(tmp_path, plotted):
    d, _ = plotted
    eff, runs = pd.read_csv(d / "efficiency.csv"), pd.read_csv(d / "runs.csv")
    weak_only = eff[eff["mode"] == "weak"]
    paths = plots.efficiency_figure(weak_only, runs, "strong", tmp_path, [])
    assert all(p.exists() for p in paths) and len(paths) == 3
