"""Damaged, hostile and foreign run records through aggregate, status, compare and plot.

``tests/damaged_records/<case>/``: the files that replace a real run's records (``run/``) or
the study's (``study/``), and ``verdict.json``: the run's expected ``status`` and a piece of
its ``reason``, or the one-line ``error`` of a damaged study-level record, or ``make``: what
cannot be a file in git (a FIFO, a link to a device, another run's point.json, a cut or
duplicated plan row). Every case is applied to a copy of the session's real tiny study run
(``conftest.tiny_study_run``): no training here.

The property test mutates that run's records at random (types, ranges, truncation,
duplication, encoding) and checks that every table stays sound: each time, rate and
efficiency finite and positive or empty, each state a known one, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from scalestudy import cli
from scalestudy.analysis import aggregate
from scalestudy.report.aggregate import aggregate_study
from scalestudy.record.bounded_read import RecordError
from scalestudy.record.states import RunState
from scalestudy.report import status as st

CORPUS = Path(__file__).parents[1] / "damaged_records"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "verdict.json").is_file())
#: runs.csv / efficiency.csv columns that are times, rates or ratios: > 0 and finite, or empty
POSITIVE = ("step_time_median_s", "step_time_q25_s", "step_time_q75_s", "step_time_ci_lo_s",
            "step_time_ci_hi_s", "tokens_per_s", "tokens_per_s_per_device",
            "model_tflops_per_device", "hardware_tflops_per_device", "mfu", "hfu",
            "util_vs_measured_ceiling", "peak_tflops", "measured_ceiling_tflops")
EFF_POSITIVE = ("step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s",
                "tokens_per_s_per_device", "tokens_per_s_per_device_ci_lo",
                "tokens_per_s_per_device_ci_hi", "efficiency", "efficiency_ci_lo",
                "efficiency_ci_hi", "speedup", "speedup_ci_lo", "speedup_ci_hi", "mfu", "hfu",
                "util_vs_measured_ceiling")


@pytest.fixture
def study(tiny_study_run, tmp_path) -> Path:
    """A copy of the real tiny study's records (plan, study, calibration, run folders)."""
    _, results, _ = tiny_study_run
    src, dst = results / "tiny", tmp_path / "tiny"
    keep = ("plan.tsv", "study.json", "calibration.json", "runs")
    shutil.copytree(src, dst, ignore=lambda d, names: [] if Path(d) != src else
                    [n for n in names if n not in keep])
    return dst


def ok_runs(study_dir: Path) -> list[Path]:
    plan = pd.read_csv(study_dir / "plan.tsv", sep="\t")
    return [study_dir / "runs" / pid for pid in plan.loc[plan["feasible"], "point_id"]]


def apply_case(study_dir: Path, case: str) -> Path:
    """Put the case's files in place; returns the run folder it damaged."""
    src = CORPUS / case
    verdict = json.loads((src / "verdict.json").read_text())
    runs = ok_runs(study_dir)
    target, other = runs[0], runs[1]
    for sub, dst in (("run", target), ("study", study_dir)):
        if (src / sub).is_dir():
            for f in (src / sub).iterdir():
                (dst / f.name).unlink(missing_ok=True)
                shutil.copyfile(f, dst / f.name)
    make = verdict.get("make", {})
    for rel in make.get("fifo", []):
        path = target / Path(rel).name
        path.unlink(missing_ok=True)
        os.mkfifo(path)
    for rel, to in make.get("link", {}).items():
        path = target / Path(rel).name
        path.unlink(missing_ok=True)
        path.symlink_to(to)
    for name in make.get("copy_from_other_run", []):
        shutil.copyfile(other / name, target / name)
    plan = study_dir / "plan.tsv"
    if make.get("plan_cut"):
        lines = plan.read_text().splitlines(True)
        plan.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    if make.get("plan_duplicate"):
        lines = plan.read_text().splitlines(True)
        plan.write_text("".join(lines + [lines[1]]))
    return target


def assert_sound(runs: pd.DataFrame, eff: pd.DataFrame) -> None:
    """Every state known; every time, rate and ratio finite and > 0, or empty."""
    known = {str(s) for s in RunState}
    assert set(runs["status"]) <= known, set(runs["status"])
    for df, cols in ((runs, POSITIVE), (eff, EFF_POSITIVE)):
        for c in cols:
            v = pd.to_numeric(df[c], errors="raise").dropna()
            assert ((v > 0) & v.map(math.isfinite)).all(), (c, v.tolist())
    ok = runs[runs["status"] == "ok"]
    assert ok["step_time_median_s"].notna().all() and (ok["n_steady_steps"] > 0).all()
    bad = runs[runs["status"] != "ok"]
    assert bad["step_time_median_s"].isna().all() and bad["mfu"].isna().all()


@pytest.mark.parametrize("case", CASES)
def test_damaged_record_gives_its_verdict(study, case, capsys):
    verdict = json.loads((CORPUS / case / "verdict.json").read_text())
    target = apply_case(study, case)
    if "error" in verdict:  # a study-level record: one line, exit status 2, everywhere
        with pytest.raises(RecordError, match=None) as e:
            aggregate.collect(study)
        assert verdict["error"] in str(e.value) and "\n" not in str(e.value)
        assert cli.main(["aggregate", str(study)]) == 2
        assert cli.main(["status", str(study)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 2 and verdict["error"] in err, err
        return
    runs, eff, ctx = aggregate.collect(study)
    assert_sound(runs, eff)
    row = runs.set_index("point_id").loc[target.name]
    assert row["status"] == verdict["status"], row["reason"]
    if "reason" in verdict:
        assert verdict["reason"] in row["reason"], row["reason"]
    if "message" in verdict:
        assert any(verdict["message"] in m for m in ctx["messages"]), ctx["messages"]
        assert runs["util_vs_measured_ceiling"].isna().all()
    # status agrees, on one line per point, from the same reader
    snap = st.snapshot(study, _cache={"predicted": {}, "model": ""})
    point = next(p for p in snap.points if p.point_id == target.name)
    assert point.state == verdict["status"]
    if verdict["status"] == "invalid":
        assert verdict["reason"] in point.reason
        assert verdict["reason"] in st.text(snap, limit=50)


#: Values a mutation puts where a record holds a value.
HOSTILE = [None, True, False, "fast", "", [1, 2], {}, {"a": 1}, -1, 0, -0.0, 1e-300, -1e6,
           1e308, 2**70, "\x1b[31mred\x1b[0m", "a|b<script>x</script>", float("nan")]
FILES = ("steps.jsonl", "status.json", "summary.json", "point.json", "env.json")


def _mutate_value(obj, rng: random.Random):
    """``obj`` (a JSON object) with one value, at any depth, replaced by a hostile one."""
    paths = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                paths.append(path + (k,))
                walk(v, path + (k,))
    walk(obj, ())
    if not paths:
        return HOSTILE[rng.randrange(len(HOSTILE))]
    path = paths[rng.randrange(len(paths))]
    cur = obj
    for k in path[:-1]:
        cur = cur[k]
    old = cur[path[-1]]
    if isinstance(old, (int, float)) and not isinstance(old, bool) and rng.random() < 0.5:
        cur[path[-1]] = old * rng.choice([-1, 0, 1e300, 1e-300])  # out of range
    else:
        cur[path[-1]] = HOSTILE[rng.randrange(len(HOSTILE))]
    return obj


def mutate(run_dir: Path, rng: random.Random) -> str:
    """One random damage to one record of ``run_dir``; returns what was done."""
    name = rng.choice(FILES)
    path = run_dir / name
    data = path.read_bytes()
    kind = rng.choice(["type", "type", "truncate", "duplicate", "encoding"])
    try:
        text = data.decode()
        json.loads(text) if name != "steps.jsonl" else [json.loads(x) for x in text.splitlines()]
    except ValueError:  # damaged by an earlier mutation already
        kind = rng.choice(["truncate", "duplicate", "encoding"])
    if not data:
        return f"empty {name}"
    if kind == "type":
        if name == "steps.jsonl":
            lines = data.decode().splitlines()
            i = rng.randrange(len(lines))
            lines[i] = json.dumps(_mutate_value(json.loads(lines[i]), rng))
            data = ("\n".join(lines) + "\n").encode()
        else:
            data = json.dumps(_mutate_value(json.loads(data), rng)).encode()
    elif kind == "truncate":
        data = data[:rng.randrange(len(data))]
    elif kind == "duplicate":
        lines = data.splitlines(True) or [data]
        i = rng.randrange(len(lines))
        data = b"".join(lines[:i + 1] + [lines[i]] * rng.randint(1, 50) + lines[i + 1:])
    else:
        i = rng.randrange(len(data))
        data = rng.choice([data[:i] + b"\xff\xfe" + data[i:], data.decode(errors="replace").encode("utf-16")])
    path.write_bytes(data)
    return f"{kind} {name}"


def test_random_damage_never_gives_a_traceback_or_a_number_out_of_range(study):
    rng = random.Random(20)
    pristine = {p.name: {f: (p / f).read_bytes() for f in FILES} for p in ok_runs(study)}
    cache = {"predicted": {}, "model": ""}
    target = ok_runs(study)[0]
    for trial in range(40):
        for f, b in pristine[target.name].items():
            (target / f).write_bytes(b)
        what = [mutate(target, rng) for _ in range(rng.randint(1, 3))]
        runs, eff, _ = aggregate.collect(study)
        assert_sound(runs, eff)
        row = runs.set_index("point_id").loc[target.name]
        if row["status"] != "ok":
            assert row["status"] == "invalid" and row["reason"], (what, row["reason"])
        text = st.text(st.snapshot(study, _cache=cache))
        assert "\x1b" not in text and target.name in text or row["status"] == "ok", what


def test_compare_and_plot_of_a_damaged_study_and_hostile_host_names(study, tmp_path, capsys):
    from scalestudy.report import compare, plots

    pristine = tmp_path / "pristine"
    shutil.copytree(study, pristine)
    runs = ok_runs(study)
    for run_dir, case in zip(runs, ("steps_time_true", "env_hosts_numbers", "point_foreign")):
        for f in (CORPUS / case / "run").glob("*") if (CORPUS / case / "run").is_dir() else ():
            shutil.copyfile(f, run_dir / f.name)
        if case == "point_foreign":
            shutil.copyfile(runs[0] / "point.json", run_dir / "point.json")
    env = json.loads((runs[3] / "env.json").read_text())
    (runs[3] / "env.json").write_text(json.dumps(dict(env, hosts=["a|b<script>x</script>"])))
    # compare's tables (its figures are drawn by test_compare.py: not again here)
    studies = [compare.load_results(p, i) for i, p in enumerate([pristine, study])]
    differing = compare.label(studies)
    table = compare.ratios(studies, compare.check_definitions(studies))
    md = compare.markdown(studies, table, differing, {})
    # every < that could open a tag is escaped (CommonMark shows \< as <)
    assert re.search(r"(?<!\\)<script>", md) is None and "a\\|b\\<script>" in md
    header = next(ln for ln in md.splitlines() if ln.startswith("| study | folder"))
    row = next(ln for ln in md.splitlines() if "\\<script>" in ln)
    assert row.replace("\\|", "").count("|") == header.count("|")
    ok = table.dropna(subset=["throughput_ratio"])
    assert (ok["throughput_ratio"] > 0).all()

    aggregate_study(study)
    assert (study / "runs.csv").is_file()
    assert_sound(pd.read_csv(study / "runs.csv"), pd.read_csv(study / "efficiency.csv"))
    runs_t, eff_t = pd.read_csv(study / "runs.csv"), pd.read_csv(study / "efficiency.csv")
    drawn = plots.efficiency_figure(eff_t, runs_t, "weak", tmp_path / "fig", [], "default")
    assert [p.suffix for p in drawn] == [".png", ".pdf", ".csv"]  # (all figures: test_plots.py)
    marks = pd.read_csv(tmp_path / "fig" / "efficiency_weak.csv")
    assert "invalid" in set(marks["status"])  # the damaged run drawn as a failed point
    # plot reads study.json through the one reader: a damaged one is one line, exit 2
    shutil.copyfile(CORPUS / "study_wrong_types" / "study" / "study.json", study / "study.json")
    capsys.readouterr()
    assert cli.main(["plot", str(study)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "study.json: series" in err
    summary = (study / "summary.md").read_text()
    assert "invalid" in summary and "step_time_s True" in summary


@pytest.mark.timeout(120)
def test_a_diverged_training_writes_json_and_is_invalid(tmp_path, monkeypatch):
    """A real tiny training (the trainer's own ``loop.run``, one rank in this process) with a
    learning rate so large that the loss is NaN from step 1: every record is valid JSON, and
    aggregate and status call the run ``invalid``, the loss diverged at step 1."""
    import torch.distributed as dist

    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model
    from scalestudy.config.identity import identify
    from scalestudy.train import loop

    model = Model(name="m", layers=2, hidden=32, heads=2, seq_len=16, vocab=64)
    point = identify(Point.for_layout(model, dp=1, micro_batch=2, device="cpu", steps=4,
                                      warmup_steps=1, lr=1e30, series="d", mode="weak"))
    run_dir = tmp_path / "d" / "runs" / point.point_id
    run_dir.mkdir(parents=True)
    (run_dir / "point.json").write_text(point.json_text())
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1",
                     LOCAL_RANK="0", SCALESTUDY_ENERGY="off").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SCALESTUDY_STEP_HOOK", raising=False)
    try:
        loop.run(point, run_dir)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    for name in ("summary.json", "env.json"):  # strict JSON: no NaN or Infinity literal
        json.loads((run_dir / name).read_text(), parse_constant=lambda c: pytest.fail(c))
    lines = [json.loads(x, parse_constant=lambda c: pytest.fail(c))
             for x in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [r.get("loss_nonfinite") for r in lines] == [None, "nan", "nan", "nan"]
    (run_dir / "status.json").write_text(json.dumps({"state": "ok", "reason": ""}))
    row = {"point_id": point.point_id, "config_hash": point.config_hash, "feasible": True,
           "n": 1, "series": "d", "mode": "weak", "repeat": 0, "tokens_per_step": 32}
    run, times, _ = aggregate.read_run(row, run_dir, None, None)
    why = "loss diverged: non-finite loss (nan) at step 1"
    from scalestudy.record.run_records import run_problem

    assert run_problem(run_dir, point.to_json()) == why  # the runner's verdict: invalid too
    assert (run["status"], run["reason"], times) == ("invalid", why, [])
    (ps,), *_ = st.read_points(run_dir.parents[1], [row], timeout_s=60, now=0)
    assert ps.state == "invalid" and ps.reason == f"status ok but {why}"


def test_a_damaged_trace_or_breakdown_leaves_the_breakdown_empty_with_its_reason(study):
    """A run's cut trace (re-read as the runner reads it) or a damaged breakdown.json: that
    point's measured terms are empty and its rows say why; the other points keep theirs, and
    no table holds a number out of range."""
    from scalestudy.analysis.loss_by_term import breakdown_tables
    from scalestudy.record import trace_terms as rbreakdown

    target, other = ok_runs(study)[:2]
    trace = target / "traces" / "rank0.json.gz"
    trace.write_bytes(trace.read_bytes()[:100])
    point = json.loads((target / "point.json").read_text())
    rec = rbreakdown.write_breakdown(target, point)
    assert rec["state"] == "empty" and "rank0.json.gz: cut" in rec["reason"], rec
    runs, eff, _ = aggregate.collect(study)
    brk, loss, _ = breakdown_tables(study, runs, eff)
    mine = brk[(brk["series"] == point["series"]) & (brk["n"] == point["n"])]
    assert mine["measured_s"].isna().all() and mine["note"].str.contains("cut").all()
    assert brk["measured_s"].notna().any()  # the other points' breakdowns stand
    rng = random.Random(7)
    pristine = (other / "breakdown.json").read_bytes()
    for _ in range(30):
        (other / "breakdown.json").write_bytes(pristine)
        data = json.loads(pristine)
        (other / "breakdown.json").write_text(json.dumps(_mutate_value(data, rng)))
        brk, loss, _ = breakdown_tables(study, runs, eff)
        work = brk[brk["term"] != "unattributed_s"]  # (it holds timed - traced: any sign)
        for c in ("measured_s", "measured_share", "profiler_dilation"):
            v = pd.to_numeric(work[c], errors="raise").dropna()
            assert (v.map(math.isfinite) & (v >= -1e-9)).all(), (c, v.tolist())
        v = pd.to_numeric(brk["measured_s"], errors="raise").dropna()
        assert v.map(math.isfinite).all()
