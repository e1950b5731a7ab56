"""The parts of a point (``scalestudy.config.point.Point``), each a frozen dataclass whose fields
are checked when it is made (``scalestudy.config.checks``): the model's shape, the parallel
options beside the (dp, cp, tp, pp) shape, the training run, the profiler's steps, the
platform and the workload. Units: counts, tokens, seconds, GB (1e9 bytes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, field, fields
from typing import Mapping

from scalestudy.config.checks import (PointError, check_fields, check_name, coerce, is_integral,
                                      short)
from scalestudy.config import limits, settings
from scalestudy.config.settings import Hash, SeriesUse, setting
from scalestudy.config.site import Site
from scalestudy.config.vocab import (
    TRAIN_PRECISIONS, Arch, AttentionKernel, Checkpointing, Device, DPMode, DType, FlopsSource,
    MetricsFormat, MLPKind, PPPartition, PPSchedule, ProfileRanks, WorkloadKind,
)


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
        coerce(self, "arch", Arch)
        llama = self.arch == Arch.LLAMA
        if self.mlp is None:
            object.__setattr__(self, "mlp", MLPKind.SWIGLU if llama else MLPKind.GELU)
        if self.bias is None:
            object.__setattr__(self, "bias", not llama)
        coerce(self, "mlp", MLPKind)
        coerce(self, "attention", AttentionKernel)
        check_fields(self)
        check_name("model", "name", self.name)
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
    """Parallelism options besides the (dp, cp, tp, pp) shape, each declared once
    (:mod:`scalestudy.config.settings`)."""

    dp_mode: DPMode = setting(
        DPMode.DDP, hash=Hash.ALWAYS, ref="dp_mode", series=SeriesUse.SWEEP, tune=(), column=True,
        placeholder=True, label="",
        doc="how the data-parallel ranks hold the model state: ddp, zero1 (sharded optimizer "
            "state), fsdp_grad_op (ZeRO-2-like) or fsdp (ZeRO-3)")
    pp_schedule: PPSchedule = setting(
        PPSchedule.ONE_F_ONE_B, hash=Hash.ALWAYS, ref="pp_schedule", series=SeriesUse.SWEEP, tune=(),
        column=True, placeholder=True, label="",
        doc="the order of micro-batches in the pipeline: gpipe, 1f1b or interleaved1f1b")
    virtual_stages: int = setting(
        1, hash=Hash.ALWAYS, unit="count", minimum=1, series=SeriesUse.OVERRIDE, tune=(1, 2), column=True,
        placeholder=True, doc="pipeline stages per pp rank (above 1: interleaved1f1b)")
    pp_partition: PPPartition | tuple[int, ...] = setting(
        PPPartition.UNIFORM, ref="pp_partition", hash=Hash.WHEN_SET, series=SeriesUse.OVERRIDE,
        column=True,
        doc="how the layers split into the pp*virtual_stages stages: uniform (equal), "
            "parameters (balanced by parameter count, embeddings and head included, as "
            "DeepSpeed's partition_method=parameters), or the layers of every stage in stage "
            "order (e.g. Llama 3 405B: 7, 8 x 14, 7)")
    activation_checkpointing: Checkpointing = setting(
        Checkpointing.NONE, hash=Hash.ALWAYS, ref="activation_checkpointing", series=SeriesUse.SWEEP,
        tune=(Checkpointing.NONE, Checkpointing.FULL), column=True, placeholder=True,
        label="ac", doc="what the backward recomputes instead of keeping: none, full (every "
            "block), selective (every other block) or selective_attention (the attention core)")
    sequence_parallel: bool = setting(
        False, hash=Hash.ALWAYS, series=SeriesUse.OVERRIDE, placeholder=True,
        doc="norms run on sequence shards across the tp ranks")
    ddp_bucket_cap_mb: float | None = setting(
        None, unit="MiB", above=0, maximum=4096, hash=Hash.WHEN_SET, series=SeriesUse.SWEEP,
        column=True, placeholder=True, label="bucket",
        doc="DistributedDataParallel's gradient bucket size (bucket_cap_mb; null: torch's 25): "
            "smaller buckets start their all-reduce earlier in the backward, larger ones send "
            "fewer messages; only where the data-parallel wrapper is DistributedDataParallel")

    def __post_init__(self):
        coerce(self, "dp_mode", DPMode)
        coerce(self, "pp_schedule", PPSchedule)
        coerce(self, "activation_checkpointing", Checkpointing)
        part = self.pp_partition
        if isinstance(part, (list, tuple)):
            if not part or not all(is_integral(k) and k >= 1 for k in part):
                raise PointError(f"parallel.pp_partition: {short(part)} is not allowed (a "
                                 "list of layers per stage, each an integer >= 1, or uniform / "
                                 "parameters)")
            object.__setattr__(self, "pp_partition", tuple(int(k) for k in part))
        else:
            coerce(self, "pp_partition", PPPartition)
        check_fields(self)


@dataclass(frozen=True)
class Train:
    """The optimisation run of one point (AdamW on the synthetic token stream), each setting
    declared once (:mod:`scalestudy.config.settings`)."""

    steps: int = setting(12, hash=Hash.ALWAYS, unit="count", minimum=2,
                         maximum=limits.MAX_STEPS, placeholder=True,
                         doc="optimizer steps, warm-up included")
    warmup_steps: int = setting(3, hash=Hash.ALWAYS, unit="count", minimum=0, placeholder=True,
                                doc="first steps excluded from timing")
    lr: float = setting(0.003, hash=Hash.ALWAYS, above=0, placeholder=True,
                        doc="AdamW learning rate (constant, no schedule)")
    weight_decay: float = setting(0.0, hash=Hash.ALWAYS, minimum=0, series=SeriesUse.SWEEP,
                                  column=True, placeholder=True, label="wd",
                                  doc="AdamW decoupled weight decay coefficient")
    # (when_set: points planned before the betas were settings keep their ids)
    adam_beta1: float = setting(0.9, hash=Hash.WHEN_SET, minimum=0, below=1,
                                series=SeriesUse.SWEEP, column=True, placeholder=True,
                                label="b1", doc="AdamW's first-moment decay rate (beta1)")
    adam_beta2: float = setting(0.95, hash=Hash.WHEN_SET, minimum=0, below=1,
                                series=SeriesUse.SWEEP, column=True, placeholder=True,
                                label="b2", doc="AdamW's second-moment decay rate (beta2; "
                                                "0.95 as GPT-3 and Llama, torch's own 0.999)")
    grad_clip: float | None = setting(1.0, hash=Hash.ALWAYS, above=0,
                                      doc="the largest global gradient L2 norm; null: no "
                                          "clipping")
    seed: int = setting(0, hash=Hash.ALWAYS, minimum=0, placeholder=True,
                        doc="seed of the parameters' initialisation and the synthetic tokens")
    precision: DType = setting(DType.FP32, hash=Hash.ALWAYS, ref="precision", column=True,
                               placeholder=True, doc="fp32, or bf16: bf16 compute, fp32 master weights and "
                                   "optimizer state")
    compile: bool = setting(False, hash=Hash.ALWAYS, doc="torch.compile every transformer block")

    def __post_init__(self):
        coerce(self, "precision", DType)
        if self.precision not in TRAIN_PRECISIONS:
            raise PointError(f"train.precision: {self.precision.value!r} is not trained; "
                             f"use one of {', '.join(TRAIN_PRECISIONS)}")
        check_fields(self)

    @property
    def betas(self) -> tuple[float, float]:
        """AdamW's ``betas`` (first- and second-moment decay rates)."""
        return (self.adam_beta1, self.adam_beta2)


@dataclass(frozen=True)
class Profile:
    """``torch.profiler`` traces of a point's steps (``scalestudy.train.profile``): after the
    timed window, ``warmup`` steps under the profiler (not kept), then ``steps`` traced
    steps, each profiled rank writing ``traces/rank<r>.json.gz``.
    The timed steps are not profiled, so step times are what they are without it. The section
    is hashed only when enabled (``identity.config_hash``)."""

    enabled: bool = setting(False, hash=Hash.ALWAYS, doc="trace the built-in trainer's steps after the timed "
                                       "window (a command workload traces itself: "
                                       "workload.traces)")
    steps: int = setting(3, hash=Hash.ALWAYS, unit="count", minimum=1, maximum=100,
                         doc="traced steps per point, after the timed window")
    warmup: int = setting(1, hash=Hash.ALWAYS, unit="count", minimum=0, maximum=100,
                          doc="profiler warm-up steps before them (run, not kept)")
    ranks: ProfileRanks = setting(
        ProfileRanks.ALL, hash=Hash.ALWAYS, ref="profile_ranks",
        doc="all: every rank writes a trace; groups: one rank per pipeline stage and one per "
            "data-parallel rank (tensor- and context-parallel rank 0), for large N")
    # (64, not 64.0: the default is what a profiled point's hash has always held)
    max_mb: float = setting(64, hash=Hash.ALWAYS, unit="MB (1e6 B), compressed", above=0, maximum=4096,
                            doc="the largest trace file one rank keeps; a larger one is "
                                "dropped and the breakdown says so")

    def __post_init__(self):
        coerce(self, "ranks", ProfileRanks)
        check_fields(self)

    @property
    def total_steps(self) -> int:
        """Steps run under the profiler (warm-up and traced)."""
        return self.warmup + self.steps if self.enabled else 0


#: The study's sections of declared settings (:mod:`scalestudy.config.settings`) by their key.
SETTING_SECTIONS = {"parallel": Parallel, "train": Train, "profile": Profile}
#: ``{setting: section}`` of every setting a series may set or sweep, of every section (a
#: series names a setting without its section: names are unique among these).
SERIES_SETTINGS = settings.owners(SETTING_SECTIONS, series_use=True)
#: Every tuned setting (an axis of a tuning search; one a series may set) with the values it
#: takes when ``tune.space`` leaves it out, in section and declaration order.
TUNED_SETTINGS = settings.tuned_in(SETTING_SECTIONS)


def section_of(name: str) -> type:
    """The section (its dataclass) declaring the series-settable setting ``name``."""
    return SETTING_SECTIONS[SERIES_SETTINGS[name]]

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
        coerce(self, "device", Device)
        if isinstance(self.site, AbcMapping):  # the JSON form (point.json) or a study's mapping
            try:
                object.__setattr__(self, "site", Site.resolve(self.site))
            except ValueError as e:
                raise PointError(f"platform.{e}") from None
        elif not isinstance(self.site, Site):
            raise PointError(f"platform.site: {short(self.site)} is not allowed (an object)")
        check_fields(self)
        if not 1 <= self.straggler_ratio <= 1000:
            raise PointError(f"platform.straggler_ratio: {short(self.straggler_ratio)} is not "
                             "allowed (a number from 1 to 1000)")


#: Workload fields that do not change what is measured: not hashed.
UNHASHED_WORKLOAD = ("cwd", "traces")


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
    traces: str | None = None  # where the command's own profiler writes its traces (a glob)

    def __post_init__(self):
        coerce(self, "kind", WorkloadKind)
        coerce(self, "metrics", MetricsFormat)
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
            coerce(self, "flops_per_token", FlopsSource)
        if self.kind == WorkloadKind.BUILTIN and (
                self.command or self.metrics != MetricsFormat.STEPS_JSONL
                or self.flops_per_token != FlopsSource.SHAPE or self.traces):
            raise PointError("workload: command, metrics, flops_per_token and traces are "
                             "settings of kind command (the builtin trainer writes its own)")
        if self.traces is not None and (not isinstance(self.traces, str) or not self.traces
                                        or self.traces.startswith("/") or ".." in
                                        self.traces.split("/")):
            raise PointError(f"workload.traces: {short(self.traces)} is not allowed (a glob "
                             "relative to the run folder, e.g. "
                             "'titan/profile_traces/iteration_*/rank*_trace.json')")
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
                   cwd=spec.get("cwd"), traces=spec.get("traces"))

    def to_study(self):
        """The study's ``workload:`` entry of this workload (:meth:`from_study`'s inverse, with
        ``metrics`` and ``flops_per_token`` stated)."""
        if not self.is_command:
            return str(self.kind)
        metrics = ({"log": dict(self.patterns)} if self.metrics == MetricsFormat.LOG
                   else self.metrics)
        spec = {"command": list(self.command), "metrics": metrics,
                "flops_per_token": self.flops_per_token}
        for key in ("cwd", "traces"):
            if getattr(self, key) is not None:
                spec[key] = getattr(self, key)
        return spec


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
