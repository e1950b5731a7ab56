"""``summary.json``: one run's headline, written by the built-in trainer and, for a command
workload, by the runner from the command's steps (``scalestudy.run.collect``), with the same
keys, so ``scalestudy.analysis.aggregate`` builds the same ``runs.csv`` row from either.

Keys: ``point_id``, ``config_hash``, ``repeat``, ``n_params`` (from the model block),
``steps`` (records), ``warmup_steps``, ``loss_first`` / ``loss_last`` (first and last known
finite loss), ``loss_nonfinite`` / ``loss_nonfinite_step`` (only when a step's loss was NaN or
infinite: ``"nan"``, ``"inf"`` or ``"-inf"`` and the first such step, the marker of
``scalestudy.record.loss``; the reader makes such a run ``invalid``), ``loss_noise_floor``
(the synthetic data's, built-in trainer only),
``tokens_per_step``, ``step_time_median_s`` (steady-state records), ``tokens_per_s``,
``model_flops_per_step`` / ``hardware_flops_per_step`` (``{convention: FLOPs or null}``,
``scalestudy.config.flops.point_flops_table``), ``device_type``, ``device_name``,
``hardware``, ``dtype``, ``peak_flops_per_device``, ``peak_source``, ``peak_memory_bytes``,
``memory_kind``, ``train_wall_s`` (the trainer's own time; for a command the attempt's wall
time, launcher included), ``workload``. No torch import."""

from __future__ import annotations

from statistics import median

from scalestudy.config.point import Point
from scalestudy.config import devices, flops
from scalestudy.record.loss import NONFINITE_KEY, first_nonfinite


def summary(point: Point, records: list[dict], *, device_type: str, device_name: str | None,
            peak_memory_bytes: int | None, memory_kind: str | None, train_wall_s: float,
            loss_noise_floor: float | None = None, **extra) -> dict:
    """The ``summary.json`` object of a finished run from its ``steps.jsonl`` records (warm-up
    flagged). ``extra`` keys are added as they are."""
    steady = [r["step_time_s"] for r in records if not r.get("warmup")]
    t_med = median(steady)
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    tokens = point.tokens_per_step
    key, peak, source = devices.resolve_peak(point.platform.hardware or device_name,
                                              point.train.precision)
    table = flops.point_flops_table(point)
    bad = first_nonfinite(records)
    if bad is not None:
        extra = {NONFINITE_KEY: bad[1], f"{NONFINITE_KEY}_step": bad[0], **extra}
    return {
        "point_id": point.point_id, "config_hash": point.config_hash,
        "repeat": point.repeat, "n_params": flops.param_count(point.model),
        "steps": len(records), "warmup_steps": sum(bool(r.get("warmup")) for r in records),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "loss_noise_floor": loss_noise_floor,
        "tokens_per_step": tokens, "step_time_median_s": t_med, "tokens_per_s": tokens / t_med,
        "model_flops_per_step": table["model"], "hardware_flops_per_step": table["hardware"],
        "device_type": device_type, "device_name": device_name, "hardware": key,
        "dtype": point.train.precision, "peak_flops_per_device": peak, "peak_source": source,
        "peak_memory_bytes": peak_memory_bytes, "memory_kind": memory_kind,
        "train_wall_s": train_wall_s, "workload": str(point.workload.kind), **extra,
    }
