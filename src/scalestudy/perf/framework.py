"""How a training framework schedules its communication and runs its kernels (``Framework``),
one entry of ``frameworks:`` in ``data/hardware.yaml`` (each figure's source is there). An
entry may name another as ``inherits`` and state only what differs. Overlaps are fractions in
[0, 1] of a collective's time hidden behind compute."""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields

from scalestudy.config.devices import table
from scalestudy.perf.assumption import Assumption

#: The fields an entry may state as an :class:`Assumption` (a value with its range).
FRAMEWORK_ASSUMPTIONS = ("dp_overlap", "dp_overlap_pp", "tp_overlap", "pp_overlap",
                         "software_rate")


@dataclass(frozen=True)
class Framework:
    """A training framework's schedule and kernels, as the step model reads them (module
    doc)."""

    name: str = "torch"
    """The entry's name in ``hardware.yaml`` (``torch``: scalestudy's own trainer)."""
    fused_qkv: bool = False
    """q, k, v (and SwiGLU's gate and up) are one product (Megatron) rather than separate
    ones (scalestudy's model)."""
    dp_overlap: float = 1.0
    """Fraction of the gradient reduction hidden behind the backward of the last
    micro-batch, without pipeline parallelism."""
    dp_overlap_pp: float = 0.0
    """The same with pipeline parallelism."""
    dp_exposes_one_chunk: bool = False
    """Even when hidden, one chunk of the reduction stays exposed (a layer; with PP, a virtual
    stage)."""
    dp_gather_overlap: bool = False
    """The distributed optimizer's parameter all-gather runs under the next step's first
    forward (with the same overlap)."""
    tp_overlap: float = 0.0
    """Fraction of the tensor-parallel collectives hidden behind compute."""
    tp_overlap_needs_sp: bool = True
    """``tp_overlap`` applies only with sequence parallelism."""
    pp_transfers_per_neighbour: int = 2
    """Serial transfers one micro-batch costs a stage per neighbouring stage (count):
    activation out and gradient back, 2 when each is a blocking call, 1 when the two
    directions go together."""
    pp_overlap: float = 0.0
    """Fraction of those transfers hidden in the steady state."""
    pp_overlap_needs_interleaving: bool = True
    """``pp_overlap`` applies only with the interleaved schedule."""
    pp_partitioned: bool = False
    """Each TP rank sends 1/tp of the activation and the receiver all-gathers it over TP."""
    vocab_parallel_loss: bool = False
    """The loss runs on the vocabulary-sharded logits (three all-reduces of ``b·s`` values,
    Megatron) instead of gathering them (scalestudy's trainer)."""
    fusion: str = "eager"
    """How its memory-bound kernels are fused: eager, fused or compiled
    (``scalestudy.perf.kernels``)."""
    dropout: bool = False
    """Its models run dropout (attention probabilities and hidden states, p > 0:
    Megatron-LM's defaults until 2022)."""
    grad_accumulation: str = "autograd"
    """How a stage adds each micro-batch's gradients to the step's
    (``scalestudy.perf.kernels.GRAD_ACCUMULATION``: autograd, hp_grad_copy, fsdp2, fused)."""
    grad_bytes: int | None = None
    """Bytes per element of the gradients the backward produces (None: the training
    precision's, i.e. 16-bit parameters; 4 where the parameters stay fp32 under autocast)."""
    zero1_all_reduce: bool = False
    """Its ZeRO-1 reduces the whole gradient with an all-reduce (then all-gathers the updated
    parameters) instead of reduce-scattering it."""
    tied_grad_all_reduce: bool = False
    """With pipeline stages, the first and the last stage all-reduce the gradient of the word
    embedding they share (tied embeddings) after the flush."""
    fsdp_sync_every_micro_batch: bool = False
    """Its FSDP reduce-scatters every micro-batch's gradients (FSDP2's default) instead of
    disabling the sync until the last one."""
    grad_reduce_bytes: int | None = None
    """Bytes per element of its data-parallel gradient reduction (None: the training
    precision's width; 4 where it reduces in fp32); parameters are gathered at the training
    precision's width."""
    dp_bucket_params: float | None = None
    """Gradients (elements) per data-parallel collective, at least; each bucket is one
    collective (None: one collective for the stage)."""
    dp_bucket_params_per_rank: float = 0.0
    """Gradients per collective per data-parallel rank: a bucket holds
    ``max(dp_bucket_params, dp_bucket_params_per_rank · dp)``."""
    bias_add: bool = False
    """Its linear layers add their bias in a kernel of their own, outside the product
    (``scalestudy.perf.kernels.layer_kernels``)."""
    tensor_syncs: int = 0
    """Round trips to the host per parameter tensor per step (a value read back with
    ``.item()`` or ``float()``), each the system's ``host_sync_s``."""
    tensor_sync_launches: int = 0
    """Kernels those checks launch per tensor (each a ``kernel_gap_s``)."""
    rng_state_bytes: int = 0
    """Size of the CUDA generator's state its PyTorch copies between device and host,
    synchronously, on every read or write of it (bytes; 0: a state held on the host)."""
    rng_state_copies: int = 0
    """Such copies per layer per micro-batch (a model-parallel RNG fork around the attention
    dropout)."""
    rng_state_copies_checkpointed: int = 0
    """More copies per recomputed layer (the checkpoint's saves and restores, and the fork
    again in the recomputation)."""
    dp_alternatives: tuple[str, ...] = ()
    """Other entries a run of it may have used for its data parallelism (its own options,
    e.g. Megatron-LM v1's ``--DDP-impl``): where a table does not say, a data-parallel row is
    read under each as well (``scalestudy.validation.published``)."""
    software_rate: float = 1.0
    """The rate of its computing kernels relative to the software the shared constants were
    set on (dimensionless; 1 for that software): its release, fused kernels and attention
    kernel, a stated range per framework; anchoring a series on measured points solves for it
    (``scalestudy.perf.anchor``)."""
    source: str = ""
    """Where the entry's figures come from (the entry's ``source:``)."""

    @classmethod
    def from_dict(cls, d: dict, name: str) -> tuple["Framework", dict]:
        """``(framework, {name: Assumption})`` from a ``frameworks:`` entry: each key read as
        its field's type (an overlap or rate of :data:`FRAMEWORK_ASSUMPTIONS` with its
        range)."""
        unknown = set(d) - {"description", "source", "inherits"} - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"framework {name!r}: unknown keys {sorted(unknown)}")
        hints = typing.get_type_hints(cls)
        kw, assume = {"name": name, "source": str(d.get("source", "")).strip()}, {}
        for f in fields(cls):
            if f.name in ("name", "source") or d.get(f.name) is None:
                continue
            if f.name in FRAMEWORK_ASSUMPTIONS:
                a = Assumption.parse(d[f.name])
                kw[f.name], assume[f.name] = a.value, a
                continue
            hint = hints[f.name]
            if hint == tuple[str, ...]:
                kw[f.name] = tuple(str(x) for x in d[f.name])
                continue
            kind = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
            kw[f.name] = kind(d[f.name])
        return cls(**kw), assume


def frameworks() -> dict[str, dict]:
    """The ``frameworks:`` entries of ``hardware.yaml``."""
    return table().get("frameworks", {})


def load_framework(name: str) -> tuple[Framework, dict]:
    """A framework of ``hardware.yaml`` by name and its assumptions."""
    if name not in frameworks():
        raise ValueError(f"framework {name!r}: no such entry; use one of "
                         f"{', '.join(sorted(frameworks()))}")
    return Framework.from_dict(framework_entry(name), name)


def framework_entry(name: str) -> dict:
    """The ``frameworks:`` entry ``name`` with what it ``inherits`` filled in (its own keys
    win)."""
    d = dict(frameworks()[name])
    bad = [x for x in d.get("dp_alternatives") or () if x == name or x not in frameworks()]
    if bad:
        raise ValueError(f"framework {name!r}: dp_alternatives {bad} are not other entries")
    base = d.pop("inherits", None)
    if base is None:
        return d
    if base == name or base not in frameworks():
        raise ValueError(f"framework {name!r}: inherits {base!r}, which is not another entry")
    return {**framework_entry(base), **d}
