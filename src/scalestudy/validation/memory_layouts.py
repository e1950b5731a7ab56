"""The memory model against published training layouts: each layout as a point, the model's
per-device estimate against the device's memory, and whether that verdict matches what the
source reports (``data/published_layouts.csv``: each row's ``source`` cites what the publication states,
``assumptions`` what it leaves open; ``ran`` is false where the source reports the layout does
not fit). ``memory_bytes`` is the device's memory as the driver reports it (an "80GB" A100 or
H100 holds 80 GiB: ``nvidia-smi`` shows 81920 MiB and 81559 MiB)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Parallel, Platform, Train
from scalestudy.perf import memory

#: Fraction of the device's memory a layout may use by the model (as the planner's rule).
HEADROOM = 0.9

CSV = "published_layouts.csv"


@dataclass(frozen=True)
class Layout:
    """One published layout: its point, the device's memory (bytes) and whether it ran."""

    name: str
    point: Point
    memory_bytes: float
    ran: bool
    source: str
    assumptions: str


def _partition(text: str):
    return tuple(int(k) for k in text.split(";")) if ";" in text else text


def _int_or_none(text: str) -> int | None:
    return int(text) if text.strip() else None


def layout(row: dict) -> Layout:
    """The :class:`Layout` of one CSV row (strings as read)."""
    model = Model(name=row["name"], arch=row["arch"], layers=int(row["layers"]),
                  hidden=int(row["hidden"]), heads=int(row["heads"]),
                  kv_heads=_int_or_none(row["kv_heads"]), ffn_hidden=_int_or_none(row["ffn_hidden"]),
                  seq_len=int(row["seq_len"]), vocab=int(row["vocab"]),
                  tied_embeddings=row["tied_embeddings"] == "true", attention=row["attention"])
    parallel = Parallel(dp_mode=row["dp_mode"], pp_schedule=row["pp_schedule"],
                        virtual_stages=int(row["virtual_stages"]),
                        sequence_parallel=row["sequence_parallel"] == "true",
                        activation_checkpointing=row["activation_checkpointing"],
                        pp_partition=_partition(row["pp_partition"]))
    dp, tp, pp, cp = (int(row[k]) for k in ("dp", "tp", "pp", "cp"))
    if dp * tp * pp * cp != int(row["gpus"]):
        raise ValueError(f"{CSV}: {row['name']}: dp*tp*pp*cp != gpus")
    point = Point.build(model, n=int(row["gpus"]), tp=tp, pp=pp, cp=cp,
                        micro_batch=int(row["micro_batch"]), grad_accum=int(row["grad_accum"]),
                        parallel=parallel, train=Train(precision=row["precision"]),
                        platform=Platform(device="cuda", devices_per_node=8),
                        study="published", series=row["name"])
    return Layout(row["name"], point, float(row["memory_bytes"]), row["ran"] == "true",
                  row["source"], row["assumptions"])


def published() -> list[Layout]:
    """Every row of ``data/published_layouts.csv``."""
    text = resources.files("scalestudy").joinpath("data", CSV).read_text()
    return [layout(row) for row in csv.DictReader(text.splitlines())]


def memory_rows(layouts: list[Layout] | None = None) -> list[dict]:
    """One row per published layout: the memory model's estimate of its most loaded device
    (bytes), the device's memory, the model's verdict within :data:`HEADROOM` of it, what the
    source reports (``ran``) and whether the two agree."""
    rows = []
    for lay in published() if layouts is None else layouts:
        e = memory.estimate(lay.point)
        fits, _ = memory.fits(lay.point, lay.memory_bytes, HEADROOM, e)
        rows.append({"layout": lay.name, "n": lay.point.n, "tp": lay.point.tp,
                     "pp": lay.point.pp, "dp": lay.point.dp, "cp": lay.point.cp,
                     "estimate_bytes": e["total_bytes"], "memory_bytes": lay.memory_bytes,
                     "fits": fits, "ran": lay.ran, "agrees": fits == lay.ran,
                     "source": lay.source})
    return rows


__all__ = ["Layout", "layout", "published", "memory_rows", "CSV", "HEADROOM"]
