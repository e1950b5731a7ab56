"""A finished study exported to the real trackers and read back with their own readers: a
local MLflow tracking server (SQLite store, 127.0.0.1) queried with ``MlflowClient``; W&B in
offline mode, its run files read as ``wandb.proto`` records; TensorBoard event files read with
``EventAccumulator`` (HParams included). The shared tiny study, copied and run again through
Snakemake with all three exports on (its points are reused, none is trained again), serves
every check; a second export adds nothing; a grown grid adds only its new runs; a tracker that
cannot be reached, a missing extra and a read-only log folder each end the export with one
line, exit status 1, the tables as they were."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import TINY, snakemake, trained

# found, not imported: each xdist worker collects this module, and importing the three tools
# costs seconds of CPU there (the tests import what they read with)
_MISSING = [m for m in ("mlflow", "wandb", "tensorboard") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"the {', '.join(_MISSING)} extra(s) not installed (make setup installs them)",
                allow_module_level=True)

pytestmark = pytest.mark.workflow

#: How long the tracking server may take to answer its health check (s; it starts in 5-20 s
#: on a loaded 2-core box: importing MLflow and creating its SQLite tables).
SERVER_START_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """The URI of a real MLflow tracking server (SQLite store, proxied artifacts) on a free
    port of 127.0.0.1, stopped (its whole process group) after the module."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no job workers
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_S
    try:
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=5):
                    break
            except OSError:
                assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the MLflow server did not start"
                time.sleep(0.5)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def exported(mlflow_server, tiny_study_run, tmp_path_factory):
    """The shared tiny study's folder, copied and run again through Snakemake up to its
    export job, with its export: section turning on MLflow (the server), W&B (offline) and
    TensorBoard."""
    shared_study, shared_results, _ = tiny_study_run
    root = tmp_path_factory.mktemp("exported")
    study_file, results = root / "tiny.yaml", root / "results"
    shutil.copytree(shared_results, results, symlinks=True)
    (results / "tiny" / "study.json").unlink()  # this copy takes the folder over
    doc = dict(TINY, export={"mlflow": {"tracking_uri": mlflow_server}, "wandb": {},
                             "tensorboard": {}})
    study_file.write_text(yaml.safe_dump(doc))
    r = snakemake(study_file, results, "--until", "export")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "rule export:" in r.stdout + r.stderr
    assert trained(r.stderr + r.stdout) == 0  # every point reused
    return results / "tiny"


def _table(folder: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(folder / name, dtype=str, keep_default_na=False,
                       sep="\t" if name.endswith(".tsv") else ",")


def _steps(folder: Path, pid: str) -> list[dict]:
    path = folder / "runs" / pid / "steps.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def _env(folder: Path, pid: str) -> dict:
    return json.loads((folder / "runs" / pid / "env.json").read_text())


#: Parameters checked against plan.tsv (as text there).
LAYOUT = ("series", "mode", "n", "dp", "tp", "pp", "micro_batch", "grad_accum", "global_batch",
          "seq_len", "dp_mode", "pp_schedule", "activation_checkpointing", "precision", "repeat")


def _curve(folder: Path, series: str, column: str = "efficiency") -> dict[int, float]:
    eff = _table(folder, "efficiency.csv")
    return {int(r["n"]): float(r[column]) for r in eff.to_dict("records")
            if r["series"] == series and r[column] != ""}


def _gemm_per_n(folder: Path, series: str) -> dict[int, float]:
    b = _table(folder, "breakdown.csv")
    return {int(r["n"]): float(r["measured_s"]) for r in b.to_dict("records")
            if r["series"] == series and r["term"] == "gemm_s" and r["in_step"] == "True"
            and r["measured_s"] != ""}


def test_mlflow_holds_every_point_its_steps_summary_curves_and_figures(exported,
                                                                      mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tiny")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    table, plan = _table(exported, "runs.csv"), _table(exported, "plan.tsv")
    assert set(runs) == set(table["point_id"]) | {"study"}
    plan = {r["point_id"]: r for r in plan.to_dict("records")}
    for row in table.to_dict("records"):
        pid, run = row["point_id"], runs[row["point_id"]]
        tags, params = run.data.tags, run.data.params
        assert tags["scalestudy.point_id"] == pid and tags["scalestudy.state"] == row["status"]
        assert {k: params[k] for k in LAYOUT} == {k: plan[pid][k] for k in LAYOUT}
        if row["status"] != "ok":  # the infeasible point, with its state and reason
            assert run.info.status == "FAILED" and tags["scalestudy.reason"] == row["reason"]
            assert "step_time_s" not in run.data.metrics
            continue
        env = _env(exported, pid)
        assert tags["scalestudy.git_commit"] == env["git_commit"]
        assert tags["scalestudy.host"] == ",".join(env["hosts"])
        assert run.info.status == "FINISHED"
        for k in ("step_time_median_s", "step_time_ci_lo_s", "step_time_ci_hi_s",
                  "tokens_per_s_per_device", "peak_memory_gb", "mfu"):
            if row[k] == "":  # not measured (no spec peak on a CPU, ...): left out
                assert k not in run.data.metrics, k
            else:
                assert run.data.metrics[k] == pytest.approx(float(row[k]), rel=1e-9), k
        steps = _steps(exported, pid)
        for metric in ("step_time_s", "loss"):
            hist = sorted(client.get_metric_history(run.info.run_id, metric),
                          key=lambda m: m.step)
            assert [(m.step, m.value) for m in hist] == [
                (s["step"], pytest.approx(s[metric], rel=1e-12)) for s in steps]
    study = runs["study"]
    for series in ("weak", "strong"):
        hist = client.get_metric_history(study.info.run_id, f"{series}/efficiency")
        assert {m.step: m.value for m in hist} == pytest.approx(_curve(exported, series))
        hist = client.get_metric_history(study.info.run_id, f"{series}/breakdown/gemm_s")
        assert {m.step: m.value for m in hist} == pytest.approx(_gemm_per_n(exported, series))
    figures = {f"figures/{p.name}" for p in (exported / "figures").glob("*.png")}
    assert {a.path for a in client.list_artifacts(study.info.run_id, "figures")} == figures
    got = client.download_artifacts(study.info.run_id, "summary.md", str(tmp_path))
    assert Path(got).read_bytes() == (exported / "summary.md").read_bytes()


def _wandb_runs(folder: Path) -> dict[str, dict]:
    from wandb_records import read_run

    runs = [read_run(d) for d in sorted((folder / "export" / "wandb").glob("offline-run-*"))]
    return {r["name"]: r for r in runs}


def test_wandb_offline_runs_hold_every_point_and_the_curves(exported):
    runs = _wandb_runs(exported)
    table = _table(exported, "runs.csv")
    plan = {r["point_id"]: r for r in _table(exported, "plan.tsv").to_dict("records")}
    assert set(runs) == set(table["point_id"]) | {"study"}
    for row in table.to_dict("records"):
        pid, run = row["point_id"], runs[row["point_id"]]
        assert run["group"] == "tiny" and run["job_type"] == "point" and run["project"] == "tiny"
        assert {k: run["config"][k] for k in LAYOUT} == {k: plan[pid][k] for k in LAYOUT}
        assert run["config"]["point_id"] == pid and row["status"] in run["tags"]
        assert run["summary"]["state"] == row["status"]
        assert run["summary"]["reason"] == row["reason"]
        if row["status"] != "ok":
            assert run["exit_code"] == 1 and not run["history"]
            continue
        assert run["exit_code"] == 0
        assert run["config"]["git_commit"] == _env(exported, pid)["git_commit"]
        assert run["summary"]["step_time_median_s"] == pytest.approx(
            float(row["step_time_median_s"]), rel=1e-9)
        assert [(h["_step"], h["step_time_s"], h["loss"]) for h in run["history"]] == [
            (s["step"], pytest.approx(s["step_time_s"]), pytest.approx(s["loss"]))
            for s in _steps(exported, pid)]
    study = runs["study"]
    assert study["job_type"] == "study" and study["exit_code"] == 0
    for series in ("weak", "strong"):
        logged = {h["n"]: h[f"{series}/efficiency"] for h in study["history"]
                  if f"{series}/efficiency" in h}
        assert logged == pytest.approx(_curve(exported, series))
    assert "summary.md" in study["files"]
    images = [f for f in study["files"] if f.startswith("media/images/figures/")]
    stems = [p.stem for p in (exported / "figures").glob("*.png")]
    assert len(images) == len(stems) and all(
        any(f.startswith(f"media/images/figures/{stem}_") for f in images) for stem in stems)


def _accumulator(path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
    ea.Reload()
    return ea


def test_tensorboard_event_files_hold_every_point_with_its_hparams(exported):
    from tensorboard.plugins.hparams import api_pb2, metadata

    root = exported / "export" / "tensorboard"
    table = _table(exported, "runs.csv")
    plan = {r["point_id"]: r for r in _table(exported, "plan.tsv").to_dict("records")}
    assert {p.name for p in root.iterdir()} == set(table["point_id"]) | {"study"}
    for row in table.to_dict("records"):
        pid = row["point_id"]
        ea = _accumulator(root / pid)
        content = ea.PluginTagToContent("hparams")
        start = metadata.parse_session_start_info_plugin_data(
            content[metadata.SESSION_START_INFO_TAG])
        end = metadata.parse_session_end_info_plugin_data(content[metadata.SESSION_END_INFO_TAG])
        assert start.hparams["dp"].number_value == float(plan[pid]["dp"])
        assert start.hparams["dp_mode"].string_value == plan[pid]["dp_mode"]
        assert start.hparams["state"].string_value == row["status"]
        assert end.status == (api_pb2.STATUS_SUCCESS if row["status"] == "ok"
                              else api_pb2.STATUS_FAILURE)
        if row["status"] != "ok":
            assert "step/step_time_s" not in ea.Tags()["scalars"]
            text = ea.Tensors("state")[0].tensor_proto.string_val[0].decode()
            assert text == f"{row['status']}: {row['reason']}"
            continue
        (median,) = ea.Scalars("summary/step_time_median_s")
        assert median.value == pytest.approx(float(row["step_time_median_s"]), rel=1e-6)
        assert [(e.step, e.value) for e in ea.Scalars("step/loss")] == [
            (s["step"], pytest.approx(s["loss"], rel=1e-6)) for s in _steps(exported, pid)]
    ea = _accumulator(root / "study")
    for series in ("weak", "strong"):
        got = {e.step: e.value for e in ea.Scalars(f"{series}/efficiency")}
        assert got == pytest.approx(_curve(exported, series), rel=1e-6)
    assert set(ea.Tags()["images"]) == {f"figures/{p.stem}"
                                        for p in (exported / "figures").glob("*.png")}
    md = ea.Tensors("summary.md")[0].tensor_proto.string_val[0].decode()
    assert md == (exported / "summary.md").read_text()
    exp = metadata.parse_experiment_plugin_data(
        ea.PluginTagToContent("hparams")[metadata.EXPERIMENT_TAG])
    assert {"dp", "tp", "pp", "micro_batch", "state"} <= {h.name for h in exp.hparam_infos}
    assert "summary/step_time_median_s" in {m.name.tag for m in exp.metric_infos}


def _snapshot(folder: Path, uri: str) -> dict:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tiny")
    tb = folder / "export" / "tensorboard"
    return {"mlflow": sorted(r.info.run_id for r in client.search_runs(
                [exp.experiment_id], run_view_type=ViewType.ALL)),
            "wandb": sorted(p.name for p in (folder / "export" / "wandb").glob("offline-run-*")),
            "tensorboard": sorted((str(p.relative_to(tb)), p.stat().st_mtime_ns)
                                  for p in tb.rglob("*") if p.is_file())}


def test_exporting_again_adds_nothing(exported, mlflow_server, capsys):
    from scalestudy.cli import main

    before = _snapshot(exported, mlflow_server)
    assert main(["export", str(exported)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all("0 runs created, 0 updated, 6 unchanged" in ln for ln in out)
    assert _snapshot(exported, mlflow_server) == before


SERIES_TABLES = ("runs.csv", "efficiency.csv", "breakdown.csv", "efficiency_loss.csv",
                 "plan.tsv")


def _copy(exported: Path, dest: Path, export: dict) -> Path:
    """The study's folder (no exports) at ``dest`` with ``export`` as its export: section."""
    shutil.copytree(exported, dest, symlinks=True, ignore=shutil.ignore_patterns("export"))
    doc = json.loads((dest / "study.json").read_text())
    (dest / "study.json").write_text(json.dumps({**doc, "export": export}))
    return dest


def test_an_added_series_adds_its_runs_only(exported, mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from scalestudy.report.export.study import export_study
    from wandb_records import read_run

    folder = _copy(exported, tmp_path / "tiny", {
        "mlflow": {"tracking_uri": mlflow_server, "experiment": "tiny-grown"},
        "wandb": {"project": "tiny-grown"}, "tensorboard": {}})
    full = {name: (folder / name).read_bytes() for name in SERIES_TABLES}
    for name in SERIES_TABLES:  # the study before its strong series was added
        df = _table(folder, name)
        df[df["series"] == "weak"].to_csv(folder / name, index=False,
                                          sep="\t" if name.endswith(".tsv") else ",")
    done, failed = export_study(folder)
    assert not failed and [(o.created, o.updated, o.unchanged) for o in done] == [(3, 0, 0)] * 3
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tiny-grown")
    ids = {r.info.run_name: r.info.run_id for r in client.search_runs([exp.experiment_id])}
    for name, data in full.items():
        (folder / name).write_bytes(data)
    done, failed = export_study(folder)
    n_strong = int((_table(folder, "runs.csv")["series"] == "strong").sum())
    # the strong points are new, the study's run (its curves) is written again, weak untouched
    assert not failed and [(o.created, o.updated, o.unchanged) for o in done] == [
        (n_strong, 1, 2)] * 3
    after = {r.info.run_name: r.info.run_id for r in client.search_runs([exp.experiment_id])}
    assert {k: after[k] for k in ids if k != "study"} == {k: v for k, v in ids.items()
                                                          if k != "study"}
    assert len(after) == len(ids) + n_strong
    # one offline run folder a run written: the study's run twice, under the same run id
    wb = [read_run(d) for d in (folder / "export" / "wandb").glob("offline-run-*")]
    assert len(wb) == 3 + n_strong + 1 and len({r["id"] for r in wb}) == 3 + n_strong
    assert len(list((folder / "export" / "tensorboard").iterdir())) == 3 + n_strong


def _tables_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in [*folder.glob("*.csv"), *folder.glob("*.md"), folder / "plan.tsv"]}


def _one_failure(capsys, argv, folder) -> str:
    from scalestudy.cli import main

    before = _tables_digest(folder)
    assert main(["export", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scalestudy: error: export."), err
    assert _tables_digest(folder) == before
    assert not (folder / "export" / "exported.json").exists()
    return err[0]


def test_an_unreachable_tracker_ends_the_export_with_one_line(exported, tmp_path, capsys):
    folder = _copy(exported, tmp_path / "tiny",
                   {"mlflow": {"tracking_uri": f"http://127.0.0.1:{_free_port()}"}})
    line = _one_failure(capsys, [str(folder)], folder)
    assert "export.mlflow: cannot reach the tracking server at http://127.0.0.1:" in line


def test_a_missing_extra_names_it_in_one_line(exported, tmp_path, capsys, monkeypatch):
    folder = _copy(exported, tmp_path / "tiny", {"wandb": {}})
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails, as uninstalled
    line = _one_failure(capsys, [str(folder)], folder)
    assert "pip install 'scalestudy[wandb]'" in line


def test_a_read_only_log_folder_is_one_line_and_the_other_tools_still_run(
        exported, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() == 0:  # root writes through permission bits: a read-only file system
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here ({r.stderr.strip()})")
    else:
        ro.chmod(0o555)
    try:
        folder = _copy(exported, tmp_path / "tiny", {"tensorboard": {"log_dir": str(ro / "tb")},
                                                     "wandb": {"dir": str(tmp_path / "wb")}})
        line = _one_failure(capsys, [str(folder)], folder)
        assert line.startswith(f"scalestudy: error: export.tensorboard: {ro / 'tb'}: ")
        assert "read-only file system" in line or "permission denied" in line
        assert list((tmp_path / "wb" / "wandb").glob("offline-run-*"))  # W&B was exported
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ro)], check=False)
        else:
            ro.chmod(0o755)


def test_no_export_section_means_no_export_job(tiny_study_run):
    _, results, first = tiny_study_run
    assert "rule export" not in first.stdout + first.stderr
    assert not (results / "tiny" / "export").exists()
