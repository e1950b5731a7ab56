"""The parts of a point (``scalestudy.config.point.Point``), each a frozen dataclass whose fields
are checked when it is made (``scalestudy.config.checks``): the model's shape, the parallel
options beside the (dp, cp, tp, pp) shape, the training run, the profiler's steps, the
platform and the workload. Units: counts, tokens, seconds, GB (1e9 bytes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping as AbcMapping
from dataclasses import dataclass, fields
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

    name: str = setting("model", hash=Hash.ALWAYS, study=False,
                        doc="the study's name for it (its key of the study's models)")
    # (the shape is required of a study's model; the defaults are a tiny model for tests)
    layers: int = setting(2, hash=Hash.ALWAYS, placeholder=True, unit="count", minimum=1, required=True,
                          doc="transformer blocks")
    hidden: int = setting(64, hash=Hash.ALWAYS, placeholder=True, unit="features", minimum=1, required=True,
                          doc="model width")
    heads: int = setting(4, hash=Hash.ALWAYS, placeholder=True, unit="count", minimum=1, required=True,
                         doc="attention heads (dividing hidden)")
    seq_len: int = setting(64, hash=Hash.ALWAYS, unit="tokens", minimum=1,
                           maximum=limits.MAX_SEQ_LEN, required=True,
                           doc="tokens per sequence")
    vocab: int = setting(256, hash=Hash.ALWAYS, placeholder=True, unit="tokens", minimum=2, required=True,
                         doc="vocabulary size")
    ffn_hidden: int | None = setting(
        None, hash=Hash.ALWAYS, unit="features", minimum=1,
        doc="null: 4*hidden (gelu) or Llama's rule (swiglu): int(8*hidden/3), times "
            "ffn_dim_multiplier, rounded up to multiple_of")
    mlp: MLPKind | None = setting(None, hash=Hash.ALWAYS, placeholder=True, ref="mlp",
                                  doc="null: the arch's own (gelu for gpt, swiglu for llama)")
    tied_embeddings: bool = setting(False, hash=Hash.ALWAYS, placeholder=True,
                                    doc="the output head shares the input embedding's weights")
    bias: bool | None = setting(None, hash=Hash.ALWAYS, placeholder=True,
                                doc="null: the arch's own (true for gpt, false for llama)")
    attention: AttentionKernel = setting(
        AttentionKernel.FUSED, hash=Hash.ALWAYS, ref="attention",
        doc="fused: SDPA's flash / memory-efficient kernels; math: the s x s scores are "
            "materialised")
    arch: Arch = setting(Arch.GPT, hash=Hash.ALWAYS, placeholder=True, ref="arch",
                         doc="gpt: LayerNorm, learned positions; llama: RMSNorm, rotary "
                             "positions, grouped-query attention, SwiGLU, no biases")
    kv_heads: int | None = setting(
        None, hash=Hash.ALWAYS, unit="count", minimum=1,
        doc="llama: key/value heads (grouped-query attention), dividing heads; null: heads")
    multiple_of: int | None = setting(
        None, hash=Hash.ALWAYS, placeholder=True, minimum=1,
        doc="swiglu width rounded up to a multiple of this (null: 8; Llama 3: 1024 for 8B, "
            "4096 for 70B/405B)")
    ffn_dim_multiplier: float | None = setting(
        None, hash=Hash.ALWAYS, placeholder=True, above=0,
        doc="swiglu width scale (Llama 3: 1.3 for 8B/70B, 1.2 for 405B)")
    rope_theta: float = setting(10000.0, hash=Hash.ALWAYS, placeholder=True, above=0,
                                doc="llama: rotary base (Llama 3: 500000)")
    norm_eps: float = setting(1e-5, hash=Hash.ALWAYS, placeholder=True, above=0,
                              doc="LayerNorm / RMSNorm epsilon")

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



#: Default of ``platform.straggler_ratio`` (``scalestudy.record.stragglers``).
STRAGGLER_RATIO = 1.2


@dataclass(frozen=True)
class Platform:
    """Where a point runs, each setting declared once (:mod:`scalestudy.config.settings`).
    Settings that do not change what is measured (timeouts, the nodes available, the
    straggler threshold) are not hashed: changing them never reruns a point;
    ``memory_limit_mb`` is (RLIMIT_AS changes the allocator's behaviour); of ``site`` only
    :data:`HASHED_SITE` is."""

    device: Device = setting(Device.AUTO, hash=Hash.ALWAYS, ref="device",
                             doc="auto: cuda when a GPU is visible, else cpu (gloo)")
    hardware: str | None = setting(None, hash=Hash.ALWAYS,
                                   doc="row of the peaks table (e.g. H200-SXM); null: detect "
                                       "from the device")
    devices_per_node: int = setting(8, hash=Hash.ALWAYS, unit="count", minimum=1,
                                    maximum=limits.MAX_DEVICES_PER_NODE,
                                    doc="ranks one node runs (its GPUs; on a CPU host, "
                                        "processes)")
    max_nodes: int = setting(1, hash=Hash.NEVER, unit="count", minimum=1,
                             maximum=limits.MAX_NODES_PER_POINT,
                             doc="nodes available; points needing more are skipped")
    memory_per_device_gb: float | None = setting(
        None, hash=Hash.ALWAYS, unit="GB (1e9 B)", above=0,
        doc="capacity for the memory feasibility check; null: from the peaks table, or no "
            "check")
    timeout_s: float = setting(900, hash=Hash.NEVER, unit="s", above=0,
                               maximum=limits.MAX_TIMEOUT_S,
                               doc="watchdog on a whole point")
    collective_timeout_s: float = setting(120, hash=Hash.NEVER, unit="s", above=0,
                                          maximum=limits.MAX_TIMEOUT_S,
                                          doc="process-group timeout: a hung collective fails "
                                              "after this")
    memory_limit_mb: int | None = setting(
        None, hash=Hash.WHEN_SET, unit="MiB", minimum=1,
        doc="CPU only: address-space limit (RLIMIT_AS) of each training process; a point "
            "that needs more fails with the allocator's error (oom). null: no limit")
    straggler_ratio: float = setting(
        STRAGGLER_RATIO, hash=Hash.NEVER, minimum=1, maximum=1000,
        doc="a run whose ranks were out of step by more than this (slowest/fastest rank step "
            "time, median over steady steps) is flagged as shaped by a straggler and retried "
            "within retries; not part of the point id (docs/failures.md)")
    site: Site = setting(factory=Site, hash=Hash.NEVER,
                         doc="cluster specifics for Slurm jobs (its keys hashed when set: "
                             "HASHED_SITE)")

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


#: ``platform.site`` keys that change what is measured, hashed when set (their declarations:
#: ``config.site.Site``).
HASHED_SITE = settings.names(Site, hash=Hash.WHEN_SET)


#: The sections of a point the study states once and a series may give its own settings of
#: (:mod:`scalestudy.config.settings`), by their key in the study and in ``point.json``.
SETTING_SECTIONS = {"parallel": Parallel, "train": Train, "profile": Profile,
                    "platform": Platform}
#: ``{setting: section}`` of every setting a series may set or sweep, of every section (a
#: series names a setting without its section: names are unique among these).
SERIES_SETTINGS = settings.owners(SETTING_SECTIONS, series_use=True)
#: Every tuned setting (an axis of a tuning search; one a series may set) with the values it
#: takes when ``tune.space`` leaves it out, in section and declaration order.
TUNED_SETTINGS = settings.tuned_in(SETTING_SECTIONS)


def section_of(name: str) -> type:
    """The section (its dataclass) declaring the series-settable setting ``name``."""
    return SETTING_SECTIONS[SERIES_SETTINGS[name]]


@dataclass(frozen=True)
class LogPatterns:
    """``metrics: {log: ...}`` of a command workload: named regular expressions over its
    ``stdout.log`` (colour codes removed), each one's first group the number (',' separators
    allowed). A line matching ``line`` (or, without it, the step-time / throughput expression)
    is one logged step (``scalestudy.run.logparse``)."""

    line: str | None = setting(None, hash=Hash.ALWAYS, doc="only lines matching this are read")
    step: str | None = setting(None, hash=Hash.ALWAYS,
                               doc="the optimizer step (iteration) number")
    step_time_s: str | None = setting(None, hash=Hash.ALWAYS, doc="step time (s)")
    step_time_ms: str | None = setting(None, hash=Hash.ALWAYS, doc="step time (ms)")
    loss: str | None = setting(None, hash=Hash.ALWAYS, doc="the training loss")
    tokens: str | None = setting(None, hash=Hash.ALWAYS,
                                 doc="tokens per optimizer step (all ranks)")
    samples: str | None = setting(None, hash=Hash.ALWAYS,
                                  doc="sequences per optimizer step (global batch); tokens = "
                                      "samples x seq_len")
    tokens_per_s: str | None = setting(None, hash=Hash.ALWAYS,
                                       doc="throughput of all ranks together")
    tokens_per_s_per_device: str | None = setting(None, hash=Hash.ALWAYS,
                                                  doc="throughput per device")
    peak_memory_gib: str | None = setting(None, hash=Hash.ALWAYS,
                                          doc="a negative value is unmeasured (left empty, "
                                              "memory_note says why)")
    global_batch: str | None = setting(None, hash=Hash.ALWAYS,
                                       doc="sequences per optimizer step the trainer says it "
                                           "runs (any line); checked against the point")
    seq_len: str | None = setting(None, hash=Hash.ALWAYS,
                                  doc="tokens per sequence the trainer says it runs (any "
                                      "line); checked against the point")
    total_steps: str | None = setting(None, hash=Hash.ALWAYS,
                                      doc="optimizer steps the trainer says it runs (any "
                                          "line); checked against the point")


@dataclass(frozen=True)
class Workload:
    """What runs under the launcher: scalestudy's own trainer (``builtin``) or the study's
    ``command``, an argv template filled from the point (``scalestudy.run.workload``) whose
    per-step metrics come from ``steps.jsonl`` or its log (``metrics``,
    ``scalestudy.run.collect``). ``flops_per_token``: ``shape`` (the model block, under the
    study's convention), a stated number (model FLOPs per token, forward + backward) or
    ``unknown`` (no MFU). ``cwd``: the command's working folder (absolute; the study file's
    folder by default; not hashed)."""

    kind: WorkloadKind = setting(WorkloadKind.BUILTIN, hash=Hash.ALWAYS, study=False,
                                 doc="builtin (scalestudy's trainer) or command")
    command: tuple[str, ...] = setting(
        (), hash=Hash.ALWAYS, required=True,
        schema={"type": "array", "minItems": 1, "items": {"type": "string"}},
        doc="argv template, a list (never a shell string); each {placeholder} is filled from "
            "the point inside its own argument (docs/workloads.md lists them; {python}: this "
            "Python); '{{' and '}}' are literal braces")
    metrics: MetricsFormat = setting(
        MetricsFormat.STEPS_JSONL, hash=Hash.ALWAYS,
        schema={"oneOf": [{"$ref": "#/$defs/metrics_format"},
                          {"type": "object", "additionalProperties": False,
                           "required": ["log"],
                           "properties": {"log": {"$ref": "#/$defs/log_patterns"}}}]},
        doc="steps_jsonl (the command writes $SCALESTUDY_POINT_DIR/steps.jsonl), megatron, "
            "torchtitan, or {log: {name: regex}}")
    patterns: Mapping[str, str] = setting(factory=dict, hash=Hash.ALWAYS, study=False,
                                          doc="metrics log: name -> regex (LogPatterns)")
    flops_per_token: FlopsSource | float = setting(
        FlopsSource.SHAPE, hash=Hash.ALWAYS,
        schema={"oneOf": [{"$ref": "#/$defs/flops_source"},
                          {"type": "number", "exclusiveMinimum": 0}]},
        doc="shape (from the model block, under the study's convention), unknown (no MFU), or "
            "model FLOPs per token (forward + backward) as a number")
    cwd: str | None = setting(None, hash=Hash.NEVER, schema={"type": "string"}, optional=True,
                              doc="working folder of the command, relative to the study "
                                  "file's folder (default: that folder)")
    traces: str | None = setting(
        None, hash=Hash.NEVER, optional=True,
        schema={"type": "string", "minLength": 1, "maxLength": 512,
                "pattern": "^[^/\\s][^\\n\\r]*$"},
        doc="where the command's own profiler writes its traces (Kineto JSON, one per rank), a "
            "glob relative to the run folder ({point_dir}), e.g. "
            "titan/profile_traces/iteration_*/rank*_trace.json: they are read into the run's "
            "breakdown")

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


#: The point's parts by their key in ``point.json``: the config hash applies each declared
#: setting's role (``identity.config_hash``).
POINT_SECTIONS = {"model": Model, **SETTING_SECTIONS, "workload": Workload}


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
