"""The study into a Weights & Biases project (``wandb``; offline by default: the runs are
written under ``DIR/wandb/offline-run-*`` and sent later with ``wandb sync``). Each point is a
run named by its point id, in the group of the study (``job_type`` point), with a run id
derived from the project, study and point id (the same run on every export); its config is
its ``plan.tsv`` layout and settings plus ``point_id``, ``git_commit``, ``host`` and
``state``/``reason``; its history its steps (``step_time_s``, ``loss`` per optimizer step);
its summary its ``runs.csv`` summary with ``state`` and ``reason``; its tags its state, series
and mode. The study's run (``job_type`` study) logs each series' curve and breakdown per N
(history step N), the figures as images and ``summary.md`` as a file.

A ledger beside the runs (``DIR/scalestudy-wandb.json``: run -> digest) keeps a second export
from writing an unchanged run again; a changed run is written again under the same run id
(``resume="allow"``: W&B replaces its config and summary; its history keeps the steps it had).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from scalestudy.record.io import escaping_links, write_json
from scalestudy.report.export import ExportError, ToolOutcome
from scalestudy.report.export.shape import STUDY_RUN, RunShape, StudyShape

#: The ledger of what was written (run key -> digest), in the wandb folder.
LEDGER = "scalestudy-wandb.json"


def resolve_dir(dir_: str | None, folder: Path) -> Path:
    """The folder wandb writes under: the study's, else ``folder/export``."""
    return Path(dir_) if dir_ else folder / "export"


def run_id(project: str, study: str, key: str) -> str:
    """The W&B run id of a point (or the study's run): 16 hex digits of a hash of the three
    (W&B run ids allow neither '/' nor unbounded lengths; the point id is the run's name)."""
    return hashlib.sha256(f"{project}\n{study}\n{key}".encode()).hexdigest()[:16]


def _log_run(wandb, run, shape: RunShape) -> None:
    for rec in shape.steps:
        run.log({k: rec[k] for k in ("step_time_s", "loss") if k in rec}, step=rec["step"])
    run.summary.update({**shape.summary, "state": shape.state, "reason": shape.reason})


def _log_study(wandb, run, shape: StudyShape) -> None:
    per_n: dict[int, dict[str, float]] = {}
    for kind, table in (("", shape.curves), ("breakdown/", shape.breakdown),
                        ("efficiency_lost/", shape.loss)):
        for series, rows in table.items():
            for n, values in rows:
                per_n.setdefault(n, {}).update({f"{series}/{kind}{k}": v
                                                for k, v in values.items()})
    for n in sorted(per_n):
        run.log({"n": n, **per_n[n]}, step=n)
    if shape.figures:
        run.log({f"figures/{p.stem}": wandb.Image(str(p)) for p in shape.figures},
                step=max(per_n, default=0))
    if shape.summary_md is not None:
        run.save(str(shape.summary_md), base_path=str(shape.summary_md.parent), policy="now")
    run.summary.update(shape.tags)


def keep_inside(root: Path) -> None:
    """Replace each symlink under ``root`` that leads outside it (wandb links a run's
    ``logs/debug-core.log`` to its cache folder) by a copy of its file, or remove it: the
    results folder holds no link out of it (``record.io.refuse_escaping_links``)."""
    for link, target in escaping_links(root):
        tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
        if Path(target).is_file():
            tmp.write_bytes(Path(target).read_bytes())
            tmp.replace(link)
        else:
            link.unlink()


def export(shape: StudyShape, settings) -> ToolOutcome:
    """Write ``shape`` to W&B as ``settings`` (``config.export.WandbExport``) say."""
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    root = resolve_dir(settings.dir, shape.folder)
    root.mkdir(parents=True, exist_ok=True)
    project = settings.project or shape.name
    ledger_path = root / LEDGER
    try:
        ledger = json.loads(ledger_path.read_text()) if ledger_path.is_file() else {}
    except ValueError:
        ledger = {}  # a damaged ledger: every run written again (same run ids)
    mode = str(settings.mode)
    out = ToolOutcome("wandb", f"{mode}, project {project}, {root}")
    quiet = wandb.Settings(console="off", x_disable_stats=True, disable_git=True,
                           save_code=False, silent=True, init_timeout=120)
    try:
        _export_runs(wandb, shape, settings, root, project, ledger, out, quiet)
    finally:
        keep_inside(root)
    return out


def _export_runs(wandb, shape: StudyShape, settings, root: Path, project: str, ledger: dict,
                 out: ToolOutcome, quiet) -> None:
    """Each run of ``shape`` not in ``ledger`` with its digest, written and then recorded."""
    mode = str(settings.mode)
    for key, run_shape, digest in ([(r.point_id, r, r.digest) for r in shape.runs]
                                   + [(STUDY_RUN, None, shape.digest)]):
        if ledger.get(key) == digest:
            out.unchanged += 1
            continue
        config = ({**run_shape.params, **run_shape.tags, "reason": run_shape.reason}
                  if run_shape else dict(shape.tags))
        tags = ([run_shape.state, run_shape.tags.get("series", ""), run_shape.tags.get("mode", "")]
                if run_shape else ["study"])
        try:
            run = wandb.init(project=project, entity=settings.entity, dir=str(root), mode=mode,
                             id=run_id(project, shape.name, key), resume="allow", name=key,
                             group=shape.name, job_type="point" if run_shape else "study",
                             config=config, tags=[t[:64] for t in tags if t],
                             settings=quiet, reinit="create_new")
            if run_shape is not None:
                _log_run(wandb, run, run_shape)
            else:
                _log_study(wandb, run, shape)
            run.finish(exit_code=0 if run_shape is None or run_shape.state == "ok" else 1)
        except (wandb.Error, wandb.errors.CommError, wandb.errors.UsageError) as e:
            raise ExportError(f"export.wandb: {str(e).splitlines()[0][:300]}; check "
                              "export.wandb (project, entity, mode) or `wandb login`") from None
        out.updated += key in ledger
        out.created += key not in ledger
        ledger[key] = digest
        write_json(root / LEDGER, ledger)
