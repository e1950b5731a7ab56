"""The typed sweep point: what one training run is, read by every stage.

A :class:`Point` is a model, a parallel layout, training settings and a platform, plus the
batch arithmetic that ties them together (N = dp·cp·tp·pp; global batch = micro_batch ·
grad_accum · dp sequences). The planner makes them (:meth:`Point.build`), the trainer, the
memory and performance models, ``predict``, ``tune`` and the benchmarks read them, and
``point.json`` is their JSON form (:meth:`Point.to_json` / :meth:`Point.from_json`,
versioned by :data:`SCHEMA_VERSION`). No other code builds a point by hand.

Units: batch sizes count sequences (rows), ``seq_len`` tokens, memory GB (1e9 bytes),
times seconds. An infeasible point may hold fractional ``dp`` / ``grad_accum`` /
``global_batch`` (the derivation that failed, e.g. dp = 1.5); a feasible one never does.

Every field is checked when a point is made (from the planner or a ``point.json``): integers
are ints (never 2.0, never a bool), numbers are finite, counts are at least 1 and within
:mod:`scalestudy.config.limits`, names hold no path separator or control character, and the
id is a folder name (:class:`PointError`, one line, otherwise).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Mapping

from scalestudy.number_format import whole
from scalestudy.config import limits
from scalestudy.config.checks import PointError, check_fields, check_name, coerce, short, ID_PATTERN
from scalestudy.config.parts import (Model, Parallel, Platform, Profile, Train, Workload,
                                     json_value)
from scalestudy.config.vocab import DPMode, FlopsConvention, ScalingMode

#: Version of the ``point.json`` layout; a file with another version is refused.
SCHEMA_VERSION = 2


class DPWrapper(StrEnum):
    """The wrapper the trainer puts around the model for data parallelism (derived from a
    point's layout and ``dp_mode``: ``Point.dp_wrapper``; not a study setting, so not in the
    vocabulary)."""

    NONE = "none"  # dp · cp == 1
    DDP = "ddp"  # DistributedDataParallel: ddp with tp == pp == 1, and zero1
    REPLICATE = "replicate"  # FSDP2's replicate (DTensor-based DDP): ddp with tp or pp > 1
    FULLY_SHARD = "fully_shard"  # FSDP2's fully_shard: fsdp, fsdp_grad_op


@dataclass(frozen=True)
class Point:
    """One sweep point (× repeat). See the module docstring for units and conventions."""

    model: Model
    n: int  # world size: devices (processes on a CPU host)
    dp: int | float
    tp: int
    pp: int
    micro_batch: int  # sequences per micro-batch per data-parallel rank
    grad_accum: int | float  # micro-batches per optimizer step per DP rank (= PP micro-batches)
    global_batch: int | float  # sequences per optimizer step
    nodes: int = 1
    procs_per_node: int = 1
    cp: int = 1  # context parallelism: ranks sharing one sequence (ring attention)
    parallel: Parallel = field(default_factory=Parallel)
    train: Train = field(default_factory=Train)
    platform: Platform = field(default_factory=Platform)
    study: str = ""
    series: str = ""
    mode: ScalingMode = ScalingMode.STRONG
    repeat: int = 0
    baseline_n: int | None = None
    flops_convention: FlopsConvention = FlopsConvention.MEGATRON
    references: tuple[str, ...] = ()
    retries: int = 0  # extra attempts after a crash or timeout
    workload: Workload = field(default_factory=Workload)
    profile: Profile = field(default_factory=Profile)
    feasible: bool = True
    reason: str = ""  # why the point is infeasible
    mem_estimate_gb: float | None = None
    config_hash: str = ""  # SHA-256 over everything that changes the measurement
    point_id: str = ""

    def __post_init__(self):
        self._validate()

    def _validate(self, names=None) -> None:
        """Coerce and check every field (or those in ``names``)."""
        def wanted(name):
            return names is None or name in names
        for name, enum in (("mode", ScalingMode), ("flops_convention", FlopsConvention)):
            if wanted(name):
                coerce(self, name, enum)
        if wanted("references"):
            object.__setattr__(self, "references", tuple(self.references))
        for name, part in (("model", Model), ("parallel", Parallel), ("train", Train),
                           ("platform", Platform), ("profile", Profile)):
            if wanted(name) and not isinstance(getattr(self, name), part):
                raise PointError(f"point.{name}: expected a {part.__name__}")
        check_fields(self, names)
        for name in ("study", "series"):
            if wanted(name):
                check_name("point", name, getattr(self, name))
        if wanted("point_id") and self.point_id and (
                len(self.point_id) > limits.MAX_POINT_ID or not ID_PATTERN.fullmatch(self.point_id)):
            raise PointError(f"point.point_id: {short(self.point_id)} is not allowed (at most "
                             f"{limits.MAX_POINT_ID} letters, digits, '_', '.', '-')")

    # -- the batch arithmetic ---------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.model.seq_len

    @property
    def tokens_per_step(self) -> int | float:
        return self.global_batch * self.model.seq_len

    @property
    def tokens_per_device_step(self) -> float:
        return self.tokens_per_step / self.n

    @property
    def rows_per_rank(self) -> int:
        """Sequences one data-parallel rank processes per optimizer step."""
        return int(self.micro_batch * self.grad_accum)

    @property
    def dp_cp(self) -> int | float:
        """Ranks holding the same parameters, dp · cp: gradients are averaged over them and
        ``dp_mode`` shards over them (torchtitan's ``dp_shard_cp`` mesh)."""
        return self.dp * self.cp

    @property
    def dp_wrapper(self) -> DPWrapper:
        """The trainer's data-parallel wrapper: none at dp · cp == 1; ``fully_shard`` for
        the FSDP modes; ``replicate`` for ddp combined with TP or PP; else (ddp alone, zero1)
        ``DistributedDataParallel``."""
        mode = self.parallel.dp_mode
        if self.dp_cp == 1:
            return DPWrapper.NONE
        if mode in (DPMode.FSDP, DPMode.FSDP_GRAD_OP):
            return DPWrapper.FULLY_SHARD
        if mode == DPMode.DDP and (self.tp > 1 or self.pp > 1):
            return DPWrapper.REPLICATE
        return DPWrapper.DDP

    @property
    def stages_per_rank(self) -> int:
        """Pipeline stages each pp rank holds: ``parallel.virtual_stages``, one without a
        pipeline (pp = 1)."""
        return self.parallel.virtual_stages if self.pp > 1 else 1

    @property
    def stages(self) -> int:
        """Pipeline stages in total (pp · :attr:`stages_per_rank`)."""
        return self.pp * self.stages_per_rank

    def replace(self, **changes) -> "Point":
        """A copy with ``changes``; only the changed fields are checked again (the planner
        replaces labels of many thousand points)."""
        unknown = set(changes) - _FIELD_NAMES
        if unknown:
            raise TypeError(f"Point.replace: unknown field {sorted(unknown)[0]!r}")
        new = copy.copy(self)
        for name, value in changes.items():
            object.__setattr__(new, name, value)
        new._validate(set(changes))
        return new

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def build(cls, model: Model, *, n: int, tp: int = 1, pp: int = 1, cp: int = 1,
              micro_batch: int = 1, grad_accum: int | None = None,
              global_batch: int | None = None, devices_per_node: int | None = None,
              **rest) -> "Point":
        """A point on ``n`` devices: dp = n/(cp·tp·pp) (the ``cp`` ranks of a sequence share
        its rows); with ``global_batch`` given,
        grad_accum = global_batch/(micro_batch·dp) (strong scaling), else global_batch =
        micro_batch·grad_accum·dp (weak scaling; grad_accum defaults to 1). Fractions are
        kept for the constraints to report. ``rest``: the other fields of :class:`Point`."""
        dp = whole(n / (cp * tp * pp))
        if global_batch is not None:
            ga = whole(global_batch / (micro_batch * dp))
            gb = global_batch
        else:
            ga = 1 if grad_accum is None else grad_accum
            gb = whole(micro_batch * ga * dp)
        platform = rest.get("platform") or Platform()
        per_node = devices_per_node or platform.devices_per_node
        nodes = max(1, -(-n // per_node))
        return cls(model=model, n=n, dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=micro_batch,
                   grad_accum=ga, global_batch=gb, nodes=nodes, procs_per_node=-(-n // nodes),
                   **rest)

    @classmethod
    def for_layout(cls, model: Model, *, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1,
                   micro_batch: int = 1, grad_accum: int = 1, **options) -> "Point":
        """A point from its parallel shape; ``options`` are fields of :class:`Parallel`,
        :class:`Train` or :class:`Platform` by name (``dp_mode="fsdp"``, ``precision=...``)
        or of :class:`Point` itself."""
        parts: dict[str, dict] = {"parallel": {}, "train": {}, "platform": {}}
        names = {k: {f.name for f in fields(c)} for k, c in
                 (("parallel", Parallel), ("train", Train), ("platform", Platform))}
        top = {}
        for key, value in options.items():
            owner = next((k for k, ns in names.items() if key in ns), None)
            (parts[owner] if owner else top)[key] = value
        for key, part in (("workload", Workload), ("profile", Profile)):
            if isinstance(top.get(key), Mapping):
                top[key] = part(**top[key])
        return cls.build(model, n=dp * cp * tp * pp, tp=tp, pp=pp, cp=cp,
                         micro_batch=micro_batch,
                         grad_accum=grad_accum, parallel=Parallel(**parts["parallel"]),
                         train=Train(**parts["train"]), platform=Platform(**parts["platform"]),
                         **top)

    # -- JSON (point.json) ------------------------------------------------------------------
    def to_json(self) -> dict:
        """The ``point.json`` object (derived batch figures included for readers)."""
        out = {"schema_version": SCHEMA_VERSION}
        for f in fields(self):
            out[f.name] = json_value(getattr(self, f.name))
        out.update(seq_len=self.seq_len, tokens_per_step=self.tokens_per_step,
                   tokens_per_device_step=self.tokens_per_device_step)
        return out

    @classmethod
    def from_json(cls, data: Mapping, source: str = "point.json") -> "Point":
        """The point of a ``point.json`` object; :class:`PointError` (one line) for a file of
        another version or a foreign one."""
        if not isinstance(data, Mapping):
            raise PointError(f"{source}: not a scalestudy point (a JSON object is expected)")
        version = data.get("schema_version")
        if version is None:
            raise PointError(f"{source}: no schema_version: written by an older scalestudy or "
                             "not a point at all; plan the study again (scalestudy run STUDY)")
        if version != SCHEMA_VERSION:
            raise PointError(f"{source}: schema_version {version!r}; this scalestudy reads "
                             f"version {SCHEMA_VERSION}: plan the study again with it")
        parts = {"model": Model, "parallel": Parallel, "train": Train, "platform": Platform,
                 "workload": Workload, "profile": Profile}
        known = {f.name for f in fields(cls)}
        derived = {"schema_version", "seq_len", "tokens_per_step", "tokens_per_device_step"}
        unknown = sorted(set(data) - known - derived)
        if unknown:
            raise PointError(f"{source}: unknown key {unknown[0]!r}; not a point of this "
                             "scalestudy version")
        kw = {}
        for key in known & set(data):
            value = data[key]
            if key in parts:
                value = _sub(parts[key], value, f"{source}: {key}")
            kw[key] = value
        if "model" not in kw:
            raise PointError(f"{source}: model: missing")
        try:
            return cls(**kw)
        except TypeError as e:
            raise PointError(f"{source}: {e}") from None

    def json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"


_FIELD_NAMES = frozenset(f.name for f in fields(Point))


def _sub(cls, value, where: str):
    if not isinstance(value, Mapping):
        raise PointError(f"{where}: expected an object, got {type(value).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(value) - names)
    if unknown:
        raise PointError(f"{where}.{unknown[0]}: unknown key; allowed: {', '.join(sorted(names))}")
    return cls(**value)

