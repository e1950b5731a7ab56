"""The vocabulary of a study: every enumerated setting, defined once.

The study schema's ``enum`` lists are filled from these classes when it is loaded
(``scalestudy.config.study.schema``), so the schema, the typed point, the trainer and the
models accept exactly the same words. Members are ``str`` (``StrEnum``): they compare equal to
their value, format as it, and serialise to JSON as plain strings.
"""

from __future__ import annotations

import difflib
from enum import StrEnum


class ScalingMode(StrEnum):
    """weak: tokens per device per step fixed; strong: tokens per step fixed."""

    WEAK = "weak"
    STRONG = "strong"


class DPMode(StrEnum):
    """How the data-parallel group holds the model state."""

    DDP = "ddp"  # full replicas, gradient all-reduce
    ZERO1 = "zero1"  # optimizer state sharded (ZeroRedundancyOptimizer)
    FSDP_GRAD_OP = "fsdp_grad_op"  # gradients + optimizer state sharded (ZeRO-2-like)
    FSDP = "fsdp"  # everything sharded (ZeRO-3)


class PPSchedule(StrEnum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved1f1b"


class PPPartition(StrEnum):
    """How the layers are split into pipeline stages (an explicit list of layers per stage is
    the third way, ``parallel.pp_partition: [7, 8, ..., 8, 7]``)."""

    UNIFORM = "uniform"  # equal stages (the layers must divide)
    PARAMETERS = "parameters"  # balanced by parameters, embeddings and head included


class Checkpointing(StrEnum):
    """Activation checkpointing (what is recomputed in the backward pass)."""

    NONE = "none"
    FULL = "full"  # every transformer block
    SELECTIVE = "selective"  # every other block (global index 0, 2, 4, ...), torchtitan-style
    SELECTIVE_ATTENTION = "selective_attention"  # the attention core only (Megatron's selective)


class DType(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


#: What the trainer trains in: fp32, or bf16 compute with fp32 master weights and state.
TRAIN_PRECISIONS = (DType.FP32, DType.BF16)


class MLPKind(StrEnum):
    GELU = "gelu"  # 4h, Megatron / GPT-2
    SWIGLU = "swiglu"  # Llama


class Arch(StrEnum):
    """The built-in model's architecture (``scalestudy.models``)."""

    GPT = "gpt"  # GPT-2 / Megatron: LayerNorm, learned positions, multi-head attention
    LLAMA = "llama"  # Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU


class AttentionKernel(StrEnum):
    """The attention kernel: ``fused`` (SDPA's flash / memory-efficient kernels, O(s) memory)
    or ``math`` (the s x s score matrix is materialised)."""

    FUSED = "fused"
    MATH = "math"


class Device(StrEnum):
    AUTO = "auto"  # cuda when a GPU is visible, else cpu
    CPU = "cpu"
    CUDA = "cuda"  # also ROCm builds of torch


class FlopsConvention(StrEnum):
    MEGATRON = "megatron"  # Narayanan et al. SC21, Eq. 3
    PALM = "palm"  # Chowdhery et al. 2022, App. B


class Reference(StrEnum):
    """Published results a study can overlay (``scalestudy.report.references``)."""

    FRONTIER_DASH2024 = "frontier_dash2024"  # Dash et al., ISC 2024
    MEGATRON_SC21 = "megatron_sc21"  # Narayanan et al., SC21, Table 1


class GPURequest(StrEnum):
    """How a Slurm job asks for its GPUs."""

    GRES = "gres"  # --gres=gpu:P per node
    GPUS_PER_NODE = "gpus-per-node"  # --gpus-per-node=P (e.g. Frontier)
    NONE = "none"  # the nodes' GPUs come with the node


class WorkloadKind(StrEnum):
    """What a point runs under the launcher (``scalestudy.run.workload``)."""

    BUILTIN = "builtin"  # scalestudy's own trainer (python -m scalestudy.train)
    COMMAND = "command"  # the study's argv template, filled from the point


class MetricsFormat(StrEnum):
    """Where a command workload's per-step metrics come from (``scalestudy.run.collect``)."""

    STEPS_JSONL = "steps_jsonl"  # the command writes $SCALESTUDY_POINT_DIR/steps.jsonl
    MEGATRON = "megatron"  # Megatron-LM's training_log line in stdout.log
    TORCHTITAN = "torchtitan"  # torchtitan's per-step metrics line in stdout.log
    LOG = "log"  # the study's own named regular expressions over stdout.log


class FlopsSource(StrEnum):
    """Where a command workload's FLOPs come from (besides a stated FLOPs-per-token)."""

    SHAPE = "shape"  # the study's model block, under the study's convention
    UNKNOWN = "unknown"  # no FLOPs: MFU and HFU stay empty


class FigureStyle(StrEnum):
    """Figure width and fonts (``scalestudy.report.style``)."""

    DEFAULT = "default"  # screen and report: 6.4 in wide
    SINGLE_COLUMN = "single-column"  # one column of a two-column paper: 3.5 in, 8 pt
    DOUBLE_COLUMN = "double-column"  # a paper's full text width: 7 in, 8 pt


class Sampler(StrEnum):
    """How ``scalestudy tune --measure`` picks the next layout to measure (Optuna's samplers)."""

    TPE = "tpe"  # Bayesian: tree-structured Parzen estimator (optuna.samplers.TPESampler)
    RANDOM = "random"  # uniform over the space (optuna.samplers.RandomSampler)


class ProfileRanks(StrEnum):
    """Which ranks of a profiled point write a trace (``profile.ranks``)."""

    ALL = "all"  # every rank
    GROUPS = "groups"  # one per pipeline stage and one per data-parallel rank (tp, cp rank 0)


def allowed(enum: type[StrEnum]) -> str:
    """``'a, b, c'``: the values of an enum, for error messages."""
    return ", ".join(m.value for m in enum)


def did_you_mean(word, choices) -> str:
    """``"; did you mean 'gpus'?"`` for the allowed word nearest to a misspelt one, else ``""``."""
    if not isinstance(word, str) or len(word) > 100:  # a misspelling is short; a huge value is not
        return ""
    close = difflib.get_close_matches(word, [str(c) for c in choices], n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def member(enum: type[StrEnum], value, field: str):
    """``enum(value)``, or ValueError naming ``field`` and the allowed values."""
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{field}={value!r} is not supported; allowed: {allowed(enum)}") from None


class WandbMode(StrEnum):
    """How a Weights & Biases run is written (``wandb.init(mode=...)``)."""

    OFFLINE = "offline"  # files under the run folder, sent later with `wandb sync`
    ONLINE = "online"  # sent to the W&B server as it is logged


#: The schema's ``$defs`` entries whose ``enum`` lists come from here.
SCHEMA_ENUMS: dict[str, tuple[str, ...]] = {
    "scaling_mode": tuple(ScalingMode),
    "dp_mode": tuple(DPMode),
    "pp_schedule": tuple(PPSchedule),
    "pp_partition_method": tuple(PPPartition),
    "activation_checkpointing": tuple(Checkpointing),
    "precision": TRAIN_PRECISIONS,
    "dtype": tuple(DType),
    "mlp": tuple(MLPKind),
    "arch": tuple(Arch),
    "workload_kind": tuple(WorkloadKind),
    "metrics_format": tuple(MetricsFormat),
    "flops_source": tuple(FlopsSource),
    "attention": tuple(AttentionKernel),
    "device": tuple(Device),
    "flops_convention": tuple(FlopsConvention),
    "reference": tuple(Reference),
    "gpu_request": tuple(GPURequest),
    "figure_style": tuple(FigureStyle),
    "sampler": tuple(Sampler),
    "profile_ranks": tuple(ProfileRanks),
    "wandb_mode": tuple(WandbMode),
}
