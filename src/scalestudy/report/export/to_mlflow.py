"""The study into an MLflow experiment (``MlflowClient``): the experiment is the study; each
point a run named by its point id, tagged ``scalestudy.point_id`` (the key a later export finds
it by), ``scalestudy.git_commit``, ``scalestudy.host`` and ``scalestudy.state``; parameters
are its ``plan.tsv`` layout and settings, metrics its steps (``step_time_s``, ``loss`` per
optimizer step) and summary (step 0). The study's own run (``study``) holds each series'
curve and breakdown per N (``<series>/efficiency`` at step N, ...), the figures
(``figures/``) and ``summary.md``.

MLflow keeps every logged value of a metric, so a point whose records changed (a rerun after
a failure) gets a fresh run and its old one is deleted (MLflow's trash: ``mlflow gc`` empties
it); an unchanged point is not touched.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from scalestudy.report.export import ExportError, ToolOutcome
from scalestudy.report.export.shape import STUDY_RUN, RunShape, StudyShape

#: The tag prefix of everything scalestudy sets.
PREFIX = "scalestudy."
#: Seconds the reachability check and each request wait for a tracking server.
TIMEOUT_S = 10
#: MLflow's limits per ``log_batch`` call.
BATCH = {"metrics": 1000, "params": 100, "tags": 100}


def resolve_uri(uri: str | None, folder: Path) -> str:
    """The tracking URI: the study's, else ``$MLFLOW_TRACKING_URI``, else a SQLite store in
    ``folder/export``."""
    if uri:
        return uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    (folder / "export").mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(folder / 'export' / 'mlflow.db').resolve()}"


def artifact_location(uri: str) -> str | None:
    """Where a new experiment of a local SQLite store keeps its artifacts: beside the store
    (MLflow's own default, ``./mlruns``, is relative to whatever folder the export runs in);
    None for a tracking server, which decides itself."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").resolve().as_uri()


def check_reachable(uri: str) -> None:
    """ExportError (one line) when an http(s) tracking server does not answer its health
    check within :data:`TIMEOUT_S`."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=TIMEOUT_S):
            pass
    except urllib.error.HTTPError as e:
        raise ExportError(f"export.mlflow: the tracking server at {uri} answered {e.code} to "
                          "its health check; check export.mlflow.tracking_uri") from None
    except (OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        raise ExportError(f"export.mlflow: cannot reach the tracking server at {uri} ({why}); "
                          "start it or fix export.mlflow.tracking_uri, then run "
                          "`scalestudy export` again (the study's tables are intact)") from None


def _chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _log(client, run_id: str, metrics=(), params=(), tags=()) -> None:
    for key, items in (("metrics", list(metrics)), ("params", list(params)),
                       ("tags", list(tags))):
        for part in _chunks(items, BATCH[key]):
            client.log_batch(run_id, **{key: part}, synchronous=True)


def _run_metrics(run: RunShape, now_ms: int):
    from mlflow.entities import Metric

    out = [Metric(k, v, now_ms, 0) for k, v in run.summary.items()]
    for rec in run.steps:
        out += [Metric(k, rec[k], now_ms, rec["step"]) for k in ("step_time_s", "loss")
                if k in rec]
    return out


def _per_n_metrics(shape: StudyShape, now_ms: int):
    from mlflow.entities import Metric

    out = []
    for kind, table in (("", shape.curves), ("breakdown/", shape.breakdown),
                        ("efficiency_lost/", shape.loss)):
        for series, rows in table.items():
            out += [Metric(f"{series}/{kind}{name}", v, now_ms, n)
                    for n, values in rows for name, v in values.items()]
    return out


def _tags(tags: dict[str, str], digest: str):
    from mlflow.entities import RunTag

    return [RunTag(PREFIX + k, str(v)[:5000]) for k, v in {**tags, "digest": digest}.items()]


def export(shape: StudyShape, settings) -> ToolOutcome:
    """Write ``shape`` to MLflow as ``settings`` (``config.export.MLflowExport``) say."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # (bounded: one line, soon)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(TIMEOUT_S))
    uri = resolve_uri(settings.tracking_uri, shape.folder)
    check_reachable(uri)
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    name = settings.experiment or shape.name
    client = MlflowClient(tracking_uri=uri)
    out = ToolOutcome("mlflow", f"{uri}, experiment {name}")
    try:
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else client.create_experiment(
            name, artifact_location=artifact_location(uri), tags={PREFIX + "study": shape.name})
        have, token = {}, None
        while True:  # every run of the experiment, a page at a time
            page = client.search_runs([exp_id], max_results=1000, page_token=token)
            for r in page:
                have.setdefault(r.data.tags.get(PREFIX + "point_id")
                                or (STUDY_RUN if r.data.tags.get(PREFIX + "kind") == "study"
                                    else None), []).append(r)
            token = page.token
            if not token:
                break
        now = int(time.time() * 1000)
        for key, run, digest in ([(r.point_id, r, r.digest) for r in shape.runs]
                                 + [(STUDY_RUN, None, shape.digest)]):
            old = have.get(key, [])
            if any(r.data.tags.get(PREFIX + "digest") == digest for r in old):
                out.unchanged += 1
                continue
            for r in old:
                client.delete_run(r.info.run_id)
            new = client.create_run(exp_id, run_name=key, start_time=now)
            rid = new.info.run_id
            if run is not None:
                _log(client, rid, metrics=_run_metrics(run, now),
                     params=[Param(k, v[:6000]) for k, v in run.params.items()],
                     tags=_tags({**run.tags, "reason": run.reason} if run.reason else run.tags,
                                digest))
            else:
                _log(client, rid, metrics=_per_n_metrics(shape, now),
                     tags=_tags(shape.tags, digest))
                for fig in shape.figures:
                    client.log_artifact(rid, str(fig), "figures")
                if shape.summary_md is not None:
                    client.log_artifact(rid, str(shape.summary_md))
            ok = run is None or run.state == "ok"
            with contextlib.redirect_stdout(io.StringIO()):  # (MLflow prints two links a run)
                client.set_terminated(rid, "FINISHED" if ok else "FAILED")
            out.updated += bool(old)
            out.created += not old
    except MlflowException as e:
        raise ExportError(f"export.mlflow: {uri}: {str(e).splitlines()[0][:300]}") from None
    return out
