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
import dataclasses
import hashlib
import json
import math
import numbers
import re
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from functools import lru_cache
from typing import Mapping

from scalestudy.config import limits
from scalestudy.config.site import Site
from scalestudy.config.sitepolicy import is_secret
from scalestudy.config.vocab import (
    TRAIN_PRECISIONS, Arch, AttentionKernel, Checkpointing, Device, DPMode, DType,
    FlopsConvention, FlopsSource, MetricsFormat, MLPKind, PPPartition, PPSchedule, ScalingMode,
    WorkloadKind,
)

#: Version of the ``point.json`` layout; a file with another version is refused.
SCHEMA_VERSION = 2
#: Hex digits of the config hash shown in a point id (the record holds the full SHA-256).
ID_HASH_CHARS = 12


class PointError(ValueError):
    """A point that cannot be read or built; ``str()`` is one line naming the field."""


def _is_int(x) -> bool:
    t = type(x)
    if t is int:
        return True
    return t is not bool and t is not float and isinstance(x, numbers.Integral)


def _is_real(x) -> bool:
    t = type(x)
    if t is int:
        return True
    if t is float:
        return math.isfinite(x)
    return (t is not bool and isinstance(x, numbers.Real) and math.isfinite(x))


#: Checks of a field's value by its annotation: (test, what is allowed).
_KINDS = {
    "int": (_is_int, "an integer"),
    "int | None": (lambda x: x is None or _is_int(x), "an integer or null"),
    "float": (_is_real, "a finite number"),
    "float | None": (lambda x: x is None or _is_real(x), "a finite number or null"),
    "int | float": (_is_real, "a finite number"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "str": (lambda x: isinstance(x, str), "text"),
    "str | None": (lambda x: x is None or isinstance(x, str), "text or null"),
}
#: Lower and upper bounds of counts (None: no bound on that side).
_RANGES = {
    "n": (1, limits.MAX_DEVICES), "tp": (1, limits.MAX_DEVICES), "pp": (1, limits.MAX_DEVICES),
    "cp": (1, limits.MAX_DEVICES),
    "micro_batch": (1, None), "nodes": (1, None),
    "procs_per_node": (1, limits.MAX_DEVICES_PER_NODE),
    "devices_per_node": (1, limits.MAX_DEVICES_PER_NODE), "max_nodes": (1, None),
    "repeat": (0, limits.MAX_REPEATS - 1), "retries": (0, limits.MAX_RETRIES),
    "layers": (1, None), "hidden": (1, None), "heads": (1, None), "kv_heads": (1, None),
    "multiple_of": (1, None),
    "seq_len": (1, limits.MAX_SEQ_LEN), "vocab": (1, None), "ffn_hidden": (1, None),
    "virtual_stages": (1, None), "steps": (1, None), "warmup_steps": (0, None),
    "seed": (0, None), "memory_limit_mb": (1, None),
}
_POSITIVE = ("timeout_s", "collective_timeout_s", "memory_per_device_gb")
#: What a point id and the names in it may hold (they are folder names and Snakemake
#: wildcards).
_ID = re.compile(r"[A-Za-z0-9_.-]+")
_UNSAFE_NAME = re.compile(r"[\x00-\x1f\x7f/\\]")


@lru_cache(maxsize=None)
def _checked_fields(cls) -> tuple:
    return tuple((f.name, *_KINDS[f.type]) for f in fields(cls) if f.type in _KINDS)


def _check(obj, names=None) -> None:
    """Every annotated field of ``obj`` (or those in ``names``) against its type and range."""
    owner = type(obj).__name__.lower()
    for name, test, what in _checked_fields(type(obj)):
        if names is not None and name not in names:
            continue
        value = getattr(obj, name)
        if not test(value):
            raise PointError(f"{owner}.{name}: {_short(value)} is not allowed ({what})")
        if value is None or isinstance(value, (str, bool)):
            continue
        lo, hi = _RANGES.get(name, (None, None))
        if name in _POSITIVE and value <= 0:
            raise PointError(f"{owner}.{name}: {value} is not allowed (a number > 0)")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f">= {lo}" if hi is None else f"from {lo} to {hi}"
            raise PointError(f"{owner}.{name}: {_short(value)} is not allowed (an integer "
                             f"{rng})")


def _check_name(owner: str, name: str, value: str) -> None:
    if value in (".", "..") or _UNSAFE_NAME.search(value):
        raise PointError(f"{owner}.{name}: {_short(value)} is not allowed (letters, digits, "
                         "'_', '.', '-'; no path separator or control character)")


def _short(value, limit: int = 60) -> str:
    text = repr(value) if not (_is_int(value) and abs(value) > 10**30) else "a huge integer"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _coerce(obj, name: str, enum) -> None:
    value = getattr(obj, name)
    try:
        object.__setattr__(obj, name, enum(value))
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise PointError(f"{type(obj).__name__.lower()}.{name}: {value!r} is not allowed; "
                         f"expected one of {allowed}") from None


def swiglu_width(hidden: int, multiple_of: int = 8, ffn_dim_multiplier: float | None = None) -> int:
    """Llama's SwiGLU width rule (meta-llama/llama3 ``model.py``, torchtitan's llama3 model):
    ``int(2·4h/3)``, times ``ffn_dim_multiplier`` (truncated), rounded up to a multiple of
    ``multiple_of``. Llama 3 8B (h 4096, 1.3, 1024) -> 14336; 70B (8192, 1.3, 4096) -> 28672;
    405B (16384, 1.2, 4096) -> 53248."""
    width = int(2 * (4 * hidden) / 3)
    if ffn_dim_multiplier is not None:
        width = int(ffn_dim_multiplier * width)
    return multiple_of * ((width + multiple_of - 1) // multiple_of)


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape. Sizes are counts (tokens, features, layers).

    ``arch``: ``gpt`` (LayerNorm, learned positions, multi-head attention; GELU and biases by
    default) or ``llama`` (RMSNorm, rotary positions, grouped-query attention with
    ``kv_heads`` key/value heads; SwiGLU and no biases by default). ``mlp`` / ``bias`` None:
    the architecture's default."""

    name: str = "model"  # the study's name for it (a key of the study's models)
    layers: int = 2  # transformer blocks (count)
    hidden: int = 64  # model width (features)
    heads: int = 4  # attention heads (count; divides hidden)
    seq_len: int = 64  # tokens per sequence
    vocab: int = 256  # vocabulary size (tokens)
    ffn_hidden: int | None = None  # None: 4h (gelu) or Llama's width rule (swiglu, see ffn)
    mlp: MLPKind | None = None  # None: gelu for gpt, swiglu for llama
    tied_embeddings: bool = False  # the output head shares the input embedding's weights
    bias: bool | None = None  # None: True for gpt, False for llama
    attention: AttentionKernel = AttentionKernel.FUSED  # fused (SDPA kernels) or math (s x s)
    arch: Arch = Arch.GPT  # gpt or llama (the class docstring)
    kv_heads: int | None = None  # key/value heads (grouped-query attention); None: heads
    multiple_of: int | None = None  # SwiGLU width rounded up to this (None: 8)
    ffn_dim_multiplier: float | None = None  # SwiGLU width scale (Llama 3: 1.3 / 1.2)
    rope_theta: float = 10000.0  # rotary base (llama; Llama 3: 500000)
    norm_eps: float = 1e-5  # LayerNorm / RMSNorm epsilon

    def __post_init__(self):
        _coerce(self, "arch", Arch)
        llama = self.arch == Arch.LLAMA
        if self.mlp is None:
            object.__setattr__(self, "mlp", MLPKind.SWIGLU if llama else MLPKind.GELU)
        if self.bias is None:
            object.__setattr__(self, "bias", not llama)
        _coerce(self, "mlp", MLPKind)
        _coerce(self, "attention", AttentionKernel)
        _check(self)
        _check_name("model", "name", self.name)
        if self.kv_heads is not None:
            if self.heads % self.kv_heads:
                raise PointError(f"model.kv_heads: {self.kv_heads} does not divide heads "
                                 f"{self.heads} (each key/value head serves heads/kv_heads "
                                 "query heads)")
            if not llama and self.kv_heads != self.heads:
                raise PointError("model.kv_heads: grouped-query attention needs arch llama "
                                 "(the gpt model has one key/value head per head)")
        if not llama and self.rope_theta != 10000.0:
            raise PointError("model.rope_theta: only arch llama has rotary position embeddings")
        if self.mlp != MLPKind.SWIGLU and (self.multiple_of is not None
                                       or self.ffn_dim_multiplier is not None):
            raise PointError("model.multiple_of / ffn_dim_multiplier: they shape the SwiGLU "
                             "width; with mlp gelu the width is 4h (or ffn_hidden)")

    @property
    def ffn(self) -> int:
        """The MLP's hidden width: ``ffn_hidden``; else 4h (GELU) or Llama's rule for SwiGLU
        (:func:`swiglu_width`, ``multiple_of`` 8 unless set: the tiny models stay tiny;
        Meta's own default is 256)."""
        if self.ffn_hidden:
            return int(self.ffn_hidden)
        if self.mlp == MLPKind.SWIGLU:
            return swiglu_width(self.hidden, self.multiple_of or 8, self.ffn_dim_multiplier)
        return 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads: ``kv_heads``, else one per head (multi-head attention)."""
        return self.kv_heads or self.heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: ``n_kv_heads · head_dim``."""
        return self.n_kv_heads * self.head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of the MLP: 2 for GELU (up, down), 3 for SwiGLU (gate, up, down)."""
        return 3 if self.mlp == MLPKind.SWIGLU else 2


@dataclass(frozen=True)
class Parallel:
    """Parallelism options besides the (dp, cp, tp, pp) shape. ``pp_partition``: how the
    layers split into the pp·virtual_stages pipeline stages: ``uniform`` (equal stages),
    ``parameters`` (balanced by parameter count, embeddings and head included, as DeepSpeed's
    ``PipelineModule(partition_method="parameters")``) or the layers of every stage in stage
    order (e.g. Llama 3 405B: 7, 8 x 14, 7)."""

    dp_mode: DPMode = DPMode.DDP  # how the data-parallel ranks hold the model state
    pp_schedule: PPSchedule = PPSchedule.ONE_F_ONE_B  # order of micro-batches in the pipeline
    virtual_stages: int = 1  # pipeline stages per pp rank (interleaved schedule)
    sequence_parallel: bool = False  # norms run on sequence shards across the tp ranks
    activation_checkpointing: Checkpointing = Checkpointing.NONE  # what is recomputed
    pp_partition: PPPartition | tuple[int, ...] = PPPartition.UNIFORM  # layers per stage

    def __post_init__(self):
        _coerce(self, "dp_mode", DPMode)
        _coerce(self, "pp_schedule", PPSchedule)
        _coerce(self, "activation_checkpointing", Checkpointing)
        part = self.pp_partition
        if isinstance(part, (list, tuple)):
            if not part or not all(_is_int(k) and k >= 1 for k in part):
                raise PointError(f"parallel.pp_partition: {_short(part)} is not allowed (a "
                                 "list of layers per stage, each an integer >= 1, or uniform / "
                                 "parameters)")
            object.__setattr__(self, "pp_partition", tuple(int(k) for k in part))
        else:
            _coerce(self, "pp_partition", PPPartition)
        _check(self)


@dataclass(frozen=True)
class Train:
    """The optimisation run of one point (AdamW on the synthetic token stream)."""

    steps: int = 12  # optimizer steps, warm-up included
    warmup_steps: int = 3  # first steps excluded from timing
    lr: float = 0.003  # AdamW learning rate (constant, no schedule)
    weight_decay: float = 0.0  # AdamW decoupled weight decay coefficient
    grad_clip: float | None = 1.0  # max global gradient L2 norm; None: no clipping
    seed: int = 0  # of the parameters' initialisation and the synthetic tokens
    precision: DType = DType.FP32  # bf16: bf16 compute, fp32 master weights and optimizer state
    compile: bool = False  # torch.compile every block

    def __post_init__(self):
        _coerce(self, "precision", DType)
        if self.precision not in TRAIN_PRECISIONS:
            raise PointError(f"train.precision: {self.precision.value!r} is not trained; "
                             f"use one of {', '.join(TRAIN_PRECISIONS)}")
        _check(self)


#: Platform settings that do not change what is measured: not hashed, so changing them never
#: reruns a point. (``memory_limit_mb`` is hashed: RLIMIT_AS changes the allocator's
#: behaviour; of ``site`` only :data:`HASHED_SITE` is.)
UNHASHED_PLATFORM = ("timeout_s", "collective_timeout_s", "site", "max_nodes", "straggler_ratio")
#: Default of ``platform.straggler_ratio`` (``scalestudy.record.stragglers``).
STRAGGLER_RATIO = 1.2
#: ``platform.site`` keys that change what is measured, hashed when set: the ranks'
#: environment (runtime variables: OMP_NUM_THREADS, NCCL_*, ...; a secret-looking name's value
#: is never hashed, only its name), cores per process and per node, devices per node,
#: whole-node exclusivity, and the sbatch/srun/torchrun options (CPU and GPU binding). The
#: others (partition, account, qos, constraint, memory requests, gpu_request,
#: runtime_margin_min, rdzv_port) only choose or size the allocation: not hashed.
HASHED_SITE = ("env", "cpus_per_proc", "cpus_per_node", "gpus_per_node", "exclusive", "extra",
               "srun_extra", "torchrun_extra")


@dataclass(frozen=True)
class Platform:
    """Where a point runs. ``hardware`` names a device of the hardware table (None: detect)."""

    device: Device = Device.AUTO  # auto: cuda when a GPU is visible, else cpu
    hardware: str | None = None  # a device of data/hardware.yaml; None: detect it
    devices_per_node: int = 8  # ranks one node runs (its GPUs; on a CPU host, processes)
    max_nodes: int = 1  # nodes available (count); points needing more are skipped
    memory_per_device_gb: float | None = None  # capacity for the memory check (GB, 1e9 B)
    timeout_s: float = 900  # watchdog on the whole point (seconds)
    collective_timeout_s: float = 120  # process-group timeout (seconds)
    memory_limit_mb: int | None = None  # CPU only: RLIMIT_AS per training process (MiB)
    # a run whose ranks' slowest/fastest step time (median over steady steps) exceeds this is
    # flagged as shaped by a straggler, and retried within ``retries``
    straggler_ratio: float = STRAGGLER_RATIO
    site: Site = field(default_factory=Site)  # Slurm specifics (a mapping is resolved: Site)

    def __post_init__(self):
        _coerce(self, "device", Device)
        if isinstance(self.site, AbcMapping):  # the JSON form (point.json) or a study's mapping
            try:
                object.__setattr__(self, "site", Site.resolve(self.site))
            except ValueError as e:
                raise PointError(f"platform.{e}") from None
        elif not isinstance(self.site, Site):
            raise PointError(f"platform.site: {_short(self.site)} is not allowed (an object)")
        _check(self)
        if not 1 <= self.straggler_ratio <= 1000:
            raise PointError(f"platform.straggler_ratio: {_short(self.straggler_ratio)} is not "
                             "allowed (a number from 1 to 1000)")


#: Workload fields that do not change what is measured: not hashed.
UNHASHED_WORKLOAD = ("cwd",)


@dataclass(frozen=True)
class Workload:
    """What runs under the launcher: scalestudy's own trainer (``builtin``) or the study's
    ``command``, an argv template filled from the point (``scalestudy.run.workload``) whose
    per-step metrics come from ``steps.jsonl`` or its log (``metrics``,
    ``scalestudy.run.collect``). ``flops_per_token``: ``shape`` (the model block, under the
    study's convention), a stated number (model FLOPs per token, forward + backward) or
    ``unknown`` (no MFU). ``cwd``: the command's working folder (absolute; the study file's
    folder by default; not hashed)."""

    kind: WorkloadKind = WorkloadKind.BUILTIN
    command: tuple[str, ...] = ()
    metrics: MetricsFormat = MetricsFormat.STEPS_JSONL
    patterns: Mapping[str, str] = field(default_factory=dict)  # metrics "log": name -> regex
    flops_per_token: FlopsSource | float = FlopsSource.SHAPE
    cwd: str | None = None

    def __post_init__(self):
        _coerce(self, "kind", WorkloadKind)
        _coerce(self, "metrics", MetricsFormat)
        if isinstance(self.command, str):
            raise PointError("workload.command: a list of arguments (argv), never a shell "
                             "string")
        object.__setattr__(self, "command", tuple(self.command))
        if not all(isinstance(a, str) for a in self.command):
            raise PointError("workload.command: every argument must be a string")
        object.__setattr__(self, "patterns", dict(self.patterns))
        fpt = self.flops_per_token
        if isinstance(fpt, (int, float)) and not isinstance(fpt, bool):
            if not fpt > 0:
                raise PointError(f"workload.flops_per_token: {fpt!r} must be > 0")
            object.__setattr__(self, "flops_per_token", float(fpt))
        else:
            _coerce(self, "flops_per_token", FlopsSource)
        if self.kind == WorkloadKind.BUILTIN and (
                self.command or self.metrics != MetricsFormat.STEPS_JSONL
                or self.flops_per_token != FlopsSource.SHAPE):
            raise PointError("workload: command, metrics and flops_per_token are settings of "
                             "kind command (the builtin trainer writes its own)")
        if self.kind == WorkloadKind.COMMAND and not self.command:
            raise PointError("workload.command: kind command needs an argv list")
        if (self.metrics == MetricsFormat.LOG) != bool(self.patterns):
            raise PointError("workload.metrics: 'log' goes with its named regular expressions "
                             "(patterns), and patterns only with 'log'")

    @property
    def is_command(self) -> bool:
        return self.kind == WorkloadKind.COMMAND

    @classmethod
    def from_study(cls, spec) -> "Workload":
        """The workload of a study's (validated) ``workload:`` entry: ``builtin``, or
        ``{command, metrics, flops_per_token, cwd}`` where ``metrics`` is a format's name or
        ``{log: {name: regex}}``."""
        if spec is None or isinstance(spec, str):
            if spec == WorkloadKind.COMMAND:
                raise PointError("workload: command needs its argv: workload: {command: [...]}")
            return cls(kind=spec or WorkloadKind.BUILTIN)
        metrics, patterns = spec.get("metrics", MetricsFormat.STEPS_JSONL), {}
        if isinstance(metrics, Mapping):
            metrics, patterns = MetricsFormat.LOG, dict(metrics["log"])
        elif metrics == MetricsFormat.LOG:
            raise PointError("workload.metrics: log needs its expressions: metrics: {log: "
                             "{step_time_s: REGEX, ...}}")
        return cls(kind=WorkloadKind.COMMAND, command=tuple(spec["command"]), metrics=metrics,
                   patterns=patterns, flops_per_token=spec.get("flops_per_token",
                                                               FlopsSource.SHAPE),
                   cwd=spec.get("cwd"))

    def to_study(self):
        """The study's ``workload:`` entry of this workload (:meth:`from_study`'s inverse, with
        ``metrics`` and ``flops_per_token`` stated)."""
        if not self.is_command:
            return str(self.kind)
        metrics = ({"log": dict(self.patterns)} if self.metrics == MetricsFormat.LOG
                   else self.metrics)
        spec = {"command": list(self.command), "metrics": metrics,
                "flops_per_token": self.flops_per_token}
        if self.cwd is not None:
            spec["cwd"] = self.cwd
        return spec


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
                _coerce(self, name, enum)
        if wanted("references"):
            object.__setattr__(self, "references", tuple(self.references))
        for name, part in (("model", Model), ("parallel", Parallel), ("train", Train),
                           ("platform", Platform)):
            if wanted(name) and not isinstance(getattr(self, name), part):
                raise PointError(f"point.{name}: expected a {part.__name__}")
        _check(self, names)
        for name in ("study", "series"):
            if wanted(name):
                _check_name("point", name, getattr(self, name))
        if wanted("point_id") and self.point_id and (
                len(self.point_id) > limits.MAX_POINT_ID or not _ID.fullmatch(self.point_id)):
            raise PointError(f"point.point_id: {_short(self.point_id)} is not allowed (at most "
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
    def stages(self) -> int:
        """Pipeline stages in total (pp · virtual stages)."""
        return self.pp * self.parallel.virtual_stages

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
        dp = _whole(n / (cp * tp * pp))
        if global_batch is not None:
            ga = _whole(global_batch / (micro_batch * dp))
            gb = global_batch
        else:
            ga = 1 if grad_accum is None else grad_accum
            gb = _whole(micro_batch * ga * dp)
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
        if isinstance(top.get("workload"), Mapping):
            top["workload"] = Workload(**top["workload"])
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
                 "workload": Workload}
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


def json_value(value):
    """``value`` as JSON holds it: a dataclass as an object of its fields, a tuple as a list,
    a mapping as a dict (enum members are text already); a site as :meth:`Site.to_json`."""
    if isinstance(value, Site):
        return value.to_json()
    if dataclasses.is_dataclass(value):
        return {g.name: json_value(getattr(value, g.name)) for g in fields(value)}
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, (dict, AbcMapping)):  # not typing.Mapping: 10x slower isinstance
        return dict(value)
    return value


def _whole(x: float) -> int | float:
    """``x`` as an int when it is whole, else unchanged (an infeasible derivation)."""
    return int(x) if float(x).is_integer() else x


# --- identity -------------------------------------------------------------------------------

#: Fields added after points were first hashed: hashed only when they differ from their
#: default, so a point planned before they existed keeps its hash and id (and its results).
HASHED_WHEN_SET = {"cp": 1}
HASHED_WHEN_SET_PARALLEL = {"pp_partition": PPPartition.UNIFORM.value}

#: Fields that label or judge a point without changing what is measured: not hashed.
UNHASHED = ("study", "series", "repeat", "baseline_n", "feasible", "reason", "mem_estimate_gb",
            "flops_convention", "references", "retries", "config_hash", "point_id")


def measured_site(site: Site, cpu: bool = False) -> dict:
    """The :data:`HASHED_SITE` settings of a ``platform.site`` that are set; a secret-looking
    environment variable contributes its name only (its value, redacted in records, never
    enters the hash). ``cpu``: a CPU point, whose unset ``cpus_per_proc`` means 1 (so 1 is
    the same point as unset)."""
    out = {}
    for k in HASHED_SITE:
        v = getattr(site, k)
        if v in (None, "", {}, False) or (cpu and k == "cpus_per_proc" and v == 1):
            continue
        if k == "env":
            v = {n: ("<secret>" if is_secret(n) else x) for n, x in v.items()}
        out[k] = v
    return out


def config_hash(point: Point) -> str:
    """SHA-256 (hex) over everything that changes the measurement: the model, the layout,
    the training settings, the platform with its memory limit and the site settings of
    :data:`HASHED_SITE` (not names, repeat, timeouts, partition or other allocation
    choices)."""
    doc = point.to_json()
    for key in UNHASHED + ("schema_version",):
        doc.pop(key, None)
    doc["platform"] = {k: v for k, v in doc["platform"].items() if k not in UNHASHED_PLATFORM}
    if doc["platform"].get("memory_limit_mb") is None:  # (ids of points without one unchanged)
        doc["platform"].pop("memory_limit_mb", None)
    measured = measured_site(point.platform.site, cpu=point.platform.device == Device.CPU)
    if measured:  # (a point without such settings keeps its id)
        doc["platform"]["site"] = measured
    for key, default in HASHED_WHEN_SET.items():
        if doc.get(key) == default:
            del doc[key]
    for key, default in HASHED_WHEN_SET_PARALLEL.items():
        if doc["parallel"].get(key) == default:
            del doc["parallel"][key]
    doc["workload"] = {k: v for k, v in doc["workload"].items() if k not in UNHASHED_WORKLOAD}
    blob = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def _fmt(x) -> str:
    return str(int(x)) if float(x).is_integer() else "x"


def point_id(point: Point, repeat: int | None = None) -> str:
    """The readable id, also the run folder's name:
    ``<series>_n<N>_dp<dp>-tp<tp>-pp<pp>_mb<mb>-ga<ga>-gb<gb>_<hash prefix>_r<repeat>``
    (``-cp<cp>`` after the pp with context parallelism; ``repeat``: the point's own unless
    given)."""
    if not point.config_hash:
        raise PointError("point_id: the point has no config_hash yet")
    repeat = point.repeat if repeat is None else repeat
    cp = f"-cp{point.cp}" if point.cp > 1 else ""
    return (f"{point.series}_n{point.n}_dp{_fmt(point.dp)}-tp{point.tp}-pp{point.pp}{cp}"
            f"_mb{point.micro_batch}-ga{_fmt(point.grad_accum)}-gb{_fmt(point.global_batch)}"
            f"_{point.config_hash[:ID_HASH_CHARS]}_r{repeat}")


def identify(point: Point, repeat: int = 0) -> Point:
    """``point`` with its ``config_hash``, ``repeat`` and ``point_id`` set."""
    p = point.replace(config_hash=config_hash(point), repeat=repeat)
    return p.replace(point_id=point_id(p))


__all__ = ["Model", "Parallel", "Train", "Platform", "Workload", "Point", "PointError",
           "SCHEMA_VERSION", "config_hash", "point_id", "identify", "UNHASHED_PLATFORM", "HASHED_SITE",
           "measured_site", "json_value", "DPWrapper",
           "swiglu_width"]
