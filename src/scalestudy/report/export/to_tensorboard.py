"""The study as TensorBoard event files (``tensorboard``'s own event writer and protocol
buffers; no TensorFlow): a run folder per point, ``LOG_DIR/<point id>/``, with its steps
(``step/step_time_s``, ``step/loss`` per optimizer step), its summary (``summary/<name>`` at
step 0), its state and reason as text, and its layout and settings as HParams (the HParams
dashboard's table, its session status: success for an ok point, failure otherwise); and the
study's run, ``LOG_DIR/study/``, with each series' curve and breakdown per N
(``<series>/efficiency`` at step N, ...), the figures as images and ``summary.md`` as text.

Each run folder holds ``scalestudy-digest.txt``: a folder whose digest is the run's is left
alone; a changed run's folder is written beside it and renamed over it whole.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from pathlib import Path

from scalestudy.report.export import ToolOutcome
from scalestudy.report.export.shape import STUDY_RUN, RunShape, StudyShape

#: The file in each run folder that names what it holds.
DIGEST_FILE = "scalestudy-digest.txt"


def resolve_dir(log_dir: str | None, folder: Path) -> Path:
    """The log folder: the study's, else ``folder/export/tensorboard``."""
    return Path(log_dir) if log_dir else folder / "export" / "tensorboard"


def _number_or_text(v: str):
    try:
        x = float(v)
    except ValueError:
        return v
    return x


def _hparam_values(run: RunShape) -> dict:
    return {**{k: _number_or_text(v) for k, v in run.params.items()}, "state": run.state}


def _hparams_summary(tag: str, **data):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(
            plugin_data_pb2.HParamsPluginData(**data)), tensor=metadata.NULL_TENSOR)])


def _session(run: RunShape):
    """The HParams plugin's session start and end summaries of ``run`` (its hparams; success
    for an ok point, failure otherwise)."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    start = plugin_data_pb2.SessionStartInfo(group_name=run.point_id,
                                             start_time_secs=time.time())
    for k, v in _hparam_values(run).items():
        if isinstance(v, float):
            start.hparams[k].number_value = v
        else:
            start.hparams[k].string_value = v
    end = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.STATUS_SUCCESS if run.state == "ok" else api_pb2.STATUS_FAILURE,
        end_time_secs=time.time())
    return [_hparams_summary(metadata.SESSION_START_INFO_TAG, session_start_info=start),
            _hparams_summary(metadata.SESSION_END_INFO_TAG, session_end_info=end)]


def _experiment(runs: list[RunShape]):
    """The HParams plugin's experiment: every run's hparams (numbers or text) and summary
    metrics (written once, in the study's run)."""
    from tensorboard.plugins.hparams import api_pb2, metadata

    kinds: dict[str, int] = {}
    for run in runs:
        for k, v in _hparam_values(run).items():
            text = not isinstance(v, float) or kinds.get(k) == api_pb2.DATA_TYPE_STRING
            kinds[k] = api_pb2.DATA_TYPE_STRING if text else api_pb2.DATA_TYPE_FLOAT64
    metrics = sorted({f"summary/{k}" for run in runs for k in run.summary})
    exp = api_pb2.Experiment(
        hparam_infos=[api_pb2.HParamInfo(name=k, type=t) for k, t in kinds.items()],
        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m)) for m in metrics])
    return _hparams_summary(metadata.EXPERIMENT_TAG, experiment=exp)


def _scalar(tag: str, value: float):
    from tensorboard.compat.proto import summary_pb2

    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])


def _text(tag: str, text: str):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.text import metadata
    from tensorboard.util import tensor_util

    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(tag, ""),
        tensor=tensor_util.make_tensor_proto([text.encode()], shape=(1,)))])


def _image(tag: str, png: Path):
    from tensorboard.compat.proto import summary_pb2

    data = png.read_bytes()
    width, height = struct.unpack(">II", data[16:24])  # the PNG's IHDR chunk
    return summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=(
        summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                  encoded_image_string=data)))])


def _run_summaries(run: RunShape) -> list[tuple[int, object]]:
    out = [(0, _scalar(f"summary/{k}", v)) for k, v in run.summary.items()]
    for rec in run.steps:
        out += [(rec["step"], _scalar(f"step/{k}", rec[k])) for k in ("step_time_s", "loss")
                if k in rec]
    out.append((0, _text("state", f"{run.state}: {run.reason}" if run.reason else run.state)))
    out += [(0, s) for s in _session(run)]
    return out


def _study_summaries(shape: StudyShape) -> list[tuple[int, object]]:
    out = [(0, _experiment(shape.runs))]
    for kind, table in (("", shape.curves), ("breakdown/", shape.breakdown),
                        ("efficiency_lost/", shape.loss)):
        for series, rows in table.items():
            out += [(n, _scalar(f"{series}/{kind}{name}", v))
                    for n, values in rows for name, v in values.items()]
    out += [(0, _image(f"figures/{p.stem}", p)) for p in shape.figures]
    if shape.summary_md is not None:
        out.append((0, _text("summary.md", shape.summary_md.read_text())))
    return out


def _write(folder: Path, summaries, digest: str) -> None:
    """``summaries`` ((step, Summary) pairs) as one event file in a fresh folder renamed to
    ``folder`` (an older one there removed)."""
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writer = EventFileWriter(str(tmp))
    now = time.time()
    for step, summary in summaries:
        writer.add_event(event_pb2.Event(wall_time=now, step=step, summary=summary))
    writer.close()
    (tmp / DIGEST_FILE).write_text(digest + "\n")
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old)
    else:
        tmp.rename(folder)


def export(shape: StudyShape, settings) -> ToolOutcome:
    """Write ``shape`` as event files as ``settings`` (``config.export.TensorBoardExport``)
    say; OSError for a folder that cannot be written."""
    root = resolve_dir(settings.log_dir, shape.folder)
    root.mkdir(parents=True, exist_ok=True)
    out = ToolOutcome("tensorboard", str(root))
    for name, make, digest in ([(r.point_id, lambda r=r: _run_summaries(r), r.digest)
                                for r in shape.runs]
                               + [(STUDY_RUN, lambda: _study_summaries(shape), shape.digest)]):
        folder = root / name
        mark = folder / DIGEST_FILE
        if mark.is_file() and mark.read_text().strip() == digest:
            out.unchanged += 1
            continue
        existed = folder.exists()
        _write(folder, make(), digest)
        out.updated += existed
        out.created += not existed
    return out
