"""``scalestudy compare`` on two copies of the shared tiny study run: one "re-run" on another
torch with every step 25% slower (a known answer: throughput ratio 0.8 at every point,
efficiency ratio 1), then copies whose series definitions differ (refused, one line)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from scalestudy import cli

pytestmark = pytest.mark.workflow


def copy_study(src, dst, torch=None, slower=1.0, partition=None):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("report.html"))
    for run in (dst / "runs").iterdir():
        env_path = run / "env.json"
        if env_path.exists():
            env = json.loads(env_path.read_text())
            if torch:
                env["torch"] = torch
            if partition:
                env["slurm"] = {"SLURM_JOB_PARTITION": partition}
            env_path.write_text(json.dumps(env))
        steps_path = run / "steps.jsonl"
        if steps_path.exists() and slower != 1.0:
            steps = [json.loads(x) for x in steps_path.read_text().splitlines()]
            for s in steps:
                s["step_time_s"] *= slower
            steps_path.write_text("".join(json.dumps(s) + "\n" for s in steps))
    return dst


@pytest.fixture(scope="module")
def two(tiny_study_run, tmp_path_factory):
    _, results, _ = tiny_study_run
    root = tmp_path_factory.mktemp("cmp")
    a = copy_study(results / "tiny", root / "before" / "tiny")
    b = copy_study(results / "tiny", root / "after" / "tiny", torch="9.9.9", slower=1.25,
                   partition="gpu")
    return a, b, root


def test_ratios_labels_and_files(two, capsys):
    a, b, root = two
    out = root / "out"
    assert cli.main(["compare", str(a), str(b), "--out", str(out)]) == 0
    md = capsys.readouterr().out
    table = pd.read_csv(out / "compare.csv")
    ok = table[table["status_a"] == "ok"]
    assert len(ok) == 4 and set(table["status_a"]) == {"ok", "infeasible"}
    # every step 25% slower: throughput per device x0.8 exactly, efficiency unchanged
    assert ok["throughput_ratio"].tolist() == pytest.approx([0.8] * 4)
    assert ((ok["throughput_ratio_ci_lo"] <= 0.8) & (0.8 <= ok["throughput_ratio_ci_hi"])).all()
    assert ok["efficiency_ratio"].tolist() == pytest.approx([1.0] * 4)
    assert ok["util_ratio"].tolist() == pytest.approx(ok["throughput_ratio"].tolist())
    assert ok["step_time_b_s"].tolist() == pytest.approx((1.25 * ok["step_time_a_s"]).tolist(),
                                                         rel=1e-5)  # (CSV: 6 digits)
    # labels: the same study name twice -> folder; the differing environment named
    assert set(table["study"]) == {"after/tiny (torch=9.9.9, partition=gpu)"}
    assert table["baseline"].iloc[0].startswith("before/tiny (torch=")
    assert table["baseline"].iloc[0].endswith(", partition=-)")
    assert "Environment that differs: torch, partition." in md
    assert "| after/tiny (torch=9.9.9, partition=gpu) | weak | 2 |" in md
    assert "0.800 [" in md
    for name in ("efficiency", "throughput", "mfu"):
        for ext in ("png", "pdf", "csv"):
            assert (out / f"compare_{name}.{ext}").stat().st_size > 0
    data = pd.read_csv(out / "compare_efficiency.csv")
    assert set(data["study"]) == {t for t in set(table["study"]) | set(table["baseline"])}
    assert (out / "compare.md").read_text() == md.split("-> ")[0]


def _edit_plan(study, series, column, value):
    plan = pd.read_csv(study / "plan.tsv", sep="\t", keep_default_na=False)
    plan.loc[plan["series"] == series, column] = value
    plan.to_csv(study / "plan.tsv", sep="\t", index=False)


@pytest.mark.parametrize("what,edit,message", [
    ("mode", lambda d: _edit_plan(d, "weak", "mode", "strong"),
     "series 'weak': mode differs (before/tiny: weak, other/tiny: strong)"),
    ("model", None, "series 'weak': model.hidden differs (before/tiny: 32, other/tiny: 48)"),
    ("invariant", lambda d: _edit_plan(d, "strong", "tokens_per_step", 128),
     "series 'strong': invariant (tokens per step) differs (before/tiny: 64, other/tiny: 128)"),
])
def test_different_definitions_are_refused_naming_the_field(two, tmp_path, capsys, what, edit,
                                                            message):
    a, _, _ = two
    other = copy_study(a, tmp_path / "other" / "tiny")
    if what == "model":
        for pj in (other / "runs").glob("weak_*/point.json"):
            doc = json.loads(pj.read_text())
            doc["model"]["hidden"] = 48
            pj.write_text(json.dumps(doc))
    else:
        edit(other)
    assert cli.main(["compare", str(a), str(other), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scalestudy: error: ")
    assert message in err[0]
    assert not (tmp_path / "out").exists()


def test_needs_two_studies_and_a_series_in_common(two, tmp_path, capsys):
    a, _, _ = two
    assert cli.main(["compare", str(a), "--out", str(tmp_path / "o")]) == 2
    assert "at least two" in capsys.readouterr().err
    other = copy_study(a, tmp_path / "x" / "tiny")
    for s in ("weak", "strong"):
        _edit_plan(other, s, "series", f"{s}-renamed")
    assert cli.main(["compare", str(a), str(other), "--out", str(tmp_path / "o")]) == 2
    assert "no series in common" in capsys.readouterr().err
