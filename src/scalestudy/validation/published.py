"""The step model against published training throughput: every row of every shipped table
(``data/published/*.csv``, one schema; sources in ``data/published/README.md``) becomes the
``Point``s of its admissible readings on the system of its device, driven by the framework
family it ran, and the model's figure in the row's own metric and FLOPs convention is set
against the published one.

Pure: no figures, no files written (``scalestudy predict --validate`` prints and draws).

The row schema (``COLUMNS``): the layout (``tp, pp, dp, cp, vp, micro_batch, global_batch,
sequence_parallel, recompute, dp_mode``), the model (``arch, layers, hidden, heads, kv_heads,
ffn_hidden, vocab, seq_len``), ``metric`` (``tflops_per_gpu``, ``mfu_pct``, ``hfu_pct``,
``tokens_per_s_per_gpu``, ``iteration_s``) with its ``value`` and ``flops_convention``, and
``log_note``; optionally ``series`` and ``scaling`` (weak / strong) for the rows of one
scaling series.

No hidden rows: a row leaves the validation only when its FLOPs cannot be counted (no
layers, hidden size, sequence length or parallel shape), or its device or framework has no
description (``skip``, with the reason). Every other field a table leaves unsaid is read every
admissible way (``admissible``), fp8 products at every stated speed-up (``FP8_SPEEDUP``), an
unstated FLOPs convention as each convention: the central value is the median reading, the
range the envelope over the readings times the central reading's spread over the stated
assumptions (``predict_case``).

Errors are relative, ``predicted / published - 1`` (a throughput too high is positive; for
``iteration_s`` a step too long is positive, so the sign is flipped to keep "positive = the
model is optimistic" for every metric). Per table: MAPE and signed bias of the central value,
the worst row, coverage (the published value inside the range) and the range's median width
(``summary``). The series the rows form are judged in ``scalestudy.validation.series``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from importlib import resources

from scalestudy.config.point import Point
from scalestudy.config.parts import Model, Parallel, Platform, Train
from scalestudy.config.vocab import DPMode
from scalestudy.config import flops
from scalestudy.config import partition
from scalestudy.validation import frontier
from scalestudy.perf import stepmodel
from scalestudy.perf.breakdown import StepBreakdown
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.framework import load_framework

COLUMNS = ("table", "row", "device", "gpus", "framework", "arch", "params_b", "layers", "hidden",
           "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "tp", "pp", "dp", "cp", "vp",
           "sequence_parallel", "micro_batch", "global_batch", "recompute", "dp_mode",
           "flash_attention", "precision", "metric", "value", "flops_convention", "peak_tflops",
           "log_note", "source")
#: Optional columns and their defaults: ``compile`` (the model ran under torch.compile),
#: ``steady_state`` (``false``: the figure is not a steady-state measurement, e.g. one early
#: iteration of a benchmark; said in the table, modelled all the same).
#: ``convention_stated`` (``false``: the source does not say how it counts FLOPs, so its
#: FLOPs-based figures are read in every convention).
#: ``system``: the preset of the machine the row ran on, where it is not the one its device
#: maps to (``SYSTEM_OF_DEVICE``). ``mlp``: the row's MLP where it is not its ``arch``'s
#: default (``config.vocab.MLPKind``).
OPTIONAL = {"compile": "false", "steady_state": "true", "convention_stated": "true",
            "system": "", "mlp": ""}
#: FLOPs conventions a row may state (``flops_convention``): Megatron's Eq. 3 without the
#: recompute pass (``megatron``, 72·B·s·l·h²(…)) or with it (``megatron_recompute``, 96·…,
#: what Megatron-LM's and Megatron-DeepSpeed's counters print under full recompute), PaLM's
#: ``6N + 12·l·H·Q·s`` (``palm``), and ``none`` where the metric needs no FLOPs.
CONVENTIONS = ("megatron", "megatron_recompute", "palm", "none")
METRICS = ("tflops_per_gpu", "mfu_pct", "hfu_pct", "tokens_per_s_per_gpu", "iteration_s")
FLOPS_METRICS = ("tflops_per_gpu", "mfu_pct", "hfu_pct")
#: The system preset of each device of the tables (``data/hardware.yaml``).
SYSTEM_OF_DEVICE = {"A100": "dgx-a100", "H100-HBM2E-500W": "grand-teton-h100", "H100": "dgx-h100",
                    "MI250X": "frontier", "V100": "dgx2h-v100"}
#: The framework description (``hardware.yaml`` ``frameworks``) of each framework family a
#: table names (matched by prefix, first match wins).
FRAMEWORK_OF = (("megatron-deepspeed", "megatron-deepspeed"),
                ("megatron-lm-2019", "megatron-lm-2019"), ("megatron-lm", "megatron-lm"),
                ("megatron-core", "megatron-core"), ("nemo", "megatron-core"),
                ("torchtitan-asynctp", "torchtitan-asynctp"), ("torchtitan", "torchtitan"),
                ("meta-internal", "megatron-core"),
                # metaseq: fairscale FSDP with Megatron-LM's tensor-parallel layers and kernels
                ("metaseq", "megatron-lm"),
                ("deepspeed", "megatron-deepspeed"))
#: A framework description per training precision where the framework runs each through
#: different code: DeepSpeed takes bf16 through its BF16_Optimizer and fp16 through its ZeRO
#: optimizer (``hardware.yaml``: ``megatron-deepspeed-bf16``, ``megatron-deepspeed``).
FRAMEWORK_OF_PRECISION = {("megatron-deepspeed", "bf16"): "megatron-deepspeed-bf16"}
#: A table's recompute mode -> the point's (``config.vocab.Checkpointing``). "selective" is
#: Megatron's (the attention core only, Korthikanti et al. 2022) except under torchtitan,
#: whose layer-selective checkpointing re-runs every other block and whose op-selective one
#: saves every other matmul's output (``apply_ac``): both re-run about half the forward.
RECOMPUTE = {"none": "none", "full": "full", "selective": "selective_attention"}
RECOMPUTE_TORCH = {**RECOMPUTE, "selective": "selective"}
DP_MODE = {"ddp": "ddp", "zero1": "zero1", "distributed_optimizer": "zero1",
           "zero2": "fsdp_grad_op", "zero3": "fsdp", "fsdp": "fsdp", "": "ddp"}


#: The Frontier study's table: its own reference data and series (``scalestudy.validation.frontier``).
FRONTIER = "dash2024_frontier"


def table_names() -> list[str]:
    """Every validation table: the shipped ``data/published/*.csv`` by file stem, and the
    Frontier study's (``FRONTIER``)."""
    d = resources.files("scalestudy").joinpath("data", "published")
    return sorted([p.name[:-4] for p in d.iterdir() if p.name.endswith(".csv")] + [FRONTIER])


def load_table(name: str):
    """One shipped table as a DataFrame of ``COLUMNS`` (strings; empty cells as "")."""
    import pandas as pd

    f = resources.files("scalestudy").joinpath("data", "published", f"{name}.csv")
    with f.open() as fh:
        df = pd.read_csv(fh, dtype=str, keep_default_na=False)
    missing = [c for c in COLUMNS if c not in df]
    if missing:
        raise ValueError(f"data/published/{name}.csv: missing columns {missing}")
    for col, default in OPTIONAL.items():
        if col not in df:
            df[col] = default
    bad = sorted(set(df["flops_convention"]) - set(CONVENTIONS))
    if bad:
        raise ValueError(f"data/published/{name}.csv: flops_convention {bad} (use one of "
                         f"{', '.join(CONVENTIONS)})")
    return df


def _int_or(x, default=None):
    try:
        return int(float(x)) if str(x).strip() != "" else default
    except ValueError:
        return default


def _flag(x) -> bool:
    return str(x).strip().lower() in ("true", "1", "yes")


def framework_of(name: str, precision: str = "") -> str:
    """The framework description for a table's framework column and precision."""
    low = str(name).lower()
    for prefix, fw in FRAMEWORK_OF:
        if low.startswith(prefix):
            return FRAMEWORK_OF_PRECISION.get((fw, str(precision).lower()), fw)
    raise ValueError(f"framework {name!r}: no framework description maps to it")


def system_of(device: str) -> str | None:
    for prefix, system in SYSTEM_OF_DEVICE.items():
        if str(device).upper().startswith(prefix):
            return system
    return None


@dataclass(frozen=True)
class Variant:
    """One admissible reading of a published row: its point, the framework description it
    runs under, the FLOPs convention its figure is read in, and the speed-up of fp8 products
    over bf16 ones (1 for a bf16/fp16 row)."""

    point: Point
    framework: str
    convention: str
    fp8_speedup: float = 1.0


@dataclass(frozen=True)
class Case:
    """A published row as the model sees it: every admissible reading of what the table
    leaves unsaid (``variants``; ``ranged``: the names of those fields), the system it is
    predicted on, or why it cannot be (``skip``: only a row whose FLOPs cannot be counted, or
    on a device or framework without a description)."""

    table: str
    row: str
    metric: str
    published: float
    convention: str
    variants: tuple = ()
    ranged: tuple = ()
    system: str = ""
    series: str = ""
    scaling: str = ""
    skip: str = ""

    @property
    def point(self) -> Point | None:
        """The first variant's point (every variant shares the model and the device count)."""
        return self.variants[0].point if self.variants else None

    @property
    def framework(self) -> str:
        return self.variants[0].framework if self.variants else ""


#: fp8 products' speed-up over bf16 ones on a device with fp8 tensor cores: the datasheet's
#: dense ratio (H100 SXM5 1979 / 989 TFLOP/s = 2.0) at most, none at all when the casts and
#: scaling eat it (the low end), central 1.5: "up to 1.5x speedups on 512 GPU / 405B
#: parameter count scale" (pytorch/ao float8 README). The attention core stays in bf16.
FP8_SPEEDUP = (1.0, 1.5, 2.0)
#: Vocabularies an unpublished one is evaluated at: Llama 2's 32,000 and GPT-2's BPE padded
#: by Megatron to 51,200 (Korthikanti et al. 2022), Llama 3's 128,256, and the 256,000 of
#: Nemotron / Gemma-class tokenizers.
VOCABS = (32000, 51200, 128256, 256000)
#: The largest micro-batch an unpublished one is evaluated at (sequences).
MAX_MICRO_BATCH = 8


def _divisors(x: int, up_to: int) -> list[int]:
    return [d for d in range(1, min(x, up_to) + 1) if x % d == 0]


def admissible(r, tp: int, pp: int, dp: int) -> dict[str, list]:
    """``{field: [values]}`` for every layout field a row leaves empty that the model needs:
    ``micro_batch`` (the divisors of the local batch up to ``MAX_MICRO_BATCH``),
    ``global_batch`` (``dp·micro_batch`` times 1, 2, 4, 8 micro-batches, at least ``pp`` of
    them; a published one that does not split over ``dp``, computed from tokens, the nearest
    two that do), ``vp`` (2 to 8 interleaved stages: an empty ``vp`` means "interleaved, count
    not given"), ``recompute`` (none, selective, full), ``dp_mode`` (ddp or zero1, the two
    Megatron-style optimizers), ``vocab`` (``VOCABS``), ``heads`` (head dim 64 or 128),
    ``flash_attention`` (true, false), ``precision`` (bf16, fp16). A published field has one
    value."""
    layers, hidden = _int_or(r["layers"]), _int_or(r["hidden"])
    out: dict[str, list] = {}
    gb, mb = _int_or(r["global_batch"]), _int_or(r["micro_batch"])
    if gb is not None and gb % dp:  # a batch computed from tokens: the nearest that split
        out["global_batch"] = [dp * (gb // dp), dp * -(-gb // dp)]
    if gb is None:
        mbs = [mb] if mb else [1, 2]
        counts = [k for k in (1, 2, 4, 8) if k >= pp] or [pp]
        out["global_batch"] = sorted({dp * m * k for m in mbs for k in counts})
    if mb is None:
        local = [g // dp for g in out.get("global_batch", [gb])]
        out["micro_batch"] = sorted({d for x in local for d in _divisors(x, MAX_MICRO_BATCH)})
    if pp > 1 and _int_or(r["vp"]) is None:
        out["vp"] = [v for v in range(2, 9) if pp * v <= layers]
    if str(r["recompute"]).strip() == "":
        out["recompute"] = ["none", "selective", "full"]
    if dp > 1 and str(r["dp_mode"]).strip() == "":
        out["dp_mode"] = ["ddp", "zero1"]
    if _int_or(r["vocab"]) is None:
        out["vocab"] = list(VOCABS)
    if _int_or(r["heads"]) is None:
        out["heads"] = [hidden // d for d in (128, 64) if hidden % d == 0 and (hidden // d) % tp == 0]
    if str(r["flash_attention"]).strip() == "":
        out["flash_attention"] = ["true", "false"]
    if str(r["precision"]).strip() == "":
        out["precision"] = ["bf16", "fp16"]
    return out


def case(r) -> Case:
    """A table row (a mapping of ``COLUMNS``) as a ``Case`` with every admissible variant."""
    base = dict(table=str(r["table"]), row=str(r["row"]), metric=str(r["metric"]),
                published=float(r["value"]), convention=str(r["flops_convention"]),
                series=str(r.get("series", "")).strip(), scaling=str(r.get("scaling", "")).strip())
    if base["metric"] not in METRICS:
        return Case(**base, skip=f"metric {base['metric']!r} is not modelled")
    missing = [k for k in ("layers", "hidden", "seq_len", "tp", "pp", "dp")
               if _int_or(r[k]) is None]
    if missing:
        return Case(**base, skip=f"FLOPs cannot be counted: the table does not give "
                                 f"{', '.join(missing)}")
    system = str(r.get("system", "")).strip() or system_of(r["device"])
    if system is None:
        return Case(**base, skip=f"device {r['device']!r} has no system preset")
    try:
        framework_of(r["framework"], "bf16")
    except ValueError as e:
        return Case(**base, skip=str(e))
    tp, pp, dp, cp = _int_or(r["tp"]), _int_or(r["pp"]), _int_or(r["dp"]), _int_or(r["cp"], 1) or 1
    opts = admissible(r, tp, pp, dp)
    given = {"vocab": [_int_or(r["vocab"])], "micro_batch": [_int_or(r["micro_batch"])], "global_batch": [_int_or(r["global_batch"])],
             "vp": [_int_or(r["vp"], 1) or 1], "recompute": [str(r["recompute"]).lower()],
             "dp_mode": [str(r["dp_mode"]).lower()], "heads": [_int_or(r["heads"])],
             "flash_attention": [str(r["flash_attention"])],
             "precision": [str(r["precision"]).lower()]}
    fields_ = {**given, **opts}
    fp8 = str(r["precision"]).lower() == "fp8"
    conventions = ([base["convention"]] if base["metric"] not in FLOPS_METRICS or _flag(
        r.get("convention_stated", OPTIONAL["convention_stated"]))
        else ["megatron", "megatron_recompute", "palm"])
    ranged = tuple(sorted(opts) + (["flops_convention"] if len(conventions) > 1 else [])
                   + (["fp8_speedup"] if fp8 else []))
    variants, why, impls = [], "", False
    for combo in itertools.product(*fields_.values()):
        f = dict(zip(fields_, combo))
        fw = framework_of(r["framework"], f["precision"])
        try:
            point = _point(r, base, f, fw, tp, pp, dp, cp)
        except ValueError as e:
            why = str(e)
            continue
        problem = _layout_problem(point, fw)
        if problem:
            why = problem
            continue
        alternatives = dp_alternatives(point, fw)
        impls = impls or bool(alternatives)
        for impl in (fw, *alternatives):
            for conv in conventions:
                for s in (FP8_SPEEDUP if fp8 else (1.0,)):
                    variants.append(Variant(point, impl, conv, s))
    if not variants:
        return Case(**base, system=system, skip=f"no admissible layout: {why}")
    if impls:
        ranged = tuple(sorted(ranged + ("dp_impl",)))
    return Case(**base, variants=tuple(variants), ranged=ranged, system=system)


def dp_alternatives(point: Point, fw: str) -> tuple[str, ...]:
    """The other framework entries a data-parallel (DDP) reading of ``point`` may have run
    under: the data-parallel implementations ``fw`` offers (``Framework.dp_alternatives``),
    which no table states; none without data parallelism."""
    if int(point.dp) <= 1 or point.parallel.dp_mode != DPMode.DDP:
        return ()
    return load_framework(fw)[0].dp_alternatives


#: Frameworks whose pipeline needs the layers to divide evenly into the stages and, when
#: interleaved, the micro-batches to divide by the pipeline ranks: Megatron-LM of 2019-2022
#: ("The total number of layers in the transformer model should be divisible by this
#: argument value ... the number of microbatches in the pipeline ... should be divisible by
#: the PIPELINE_MP_SIZE when using this schedule", its README on the interleaved schedule).
EVEN_PIPELINES = ("megatron-lm", "megatron-lm-2019")


def partition_of(fw: str, layers: int, stages: int) -> str:
    """How a row's layers split into its ``stages``: by parameters under DeepSpeed (its
    PipelineModule's default) and, where they do not divide evenly, under a framework that
    can split them unevenly (Llama 3 405B, 126 layers on 16 stages, "one Transformer layer
    fewer on the first and the last stage", Dubey et al. 2024 §3.3.2), else uniformly."""
    uneven = stages > 1 and layers % stages != 0 and fw not in EVEN_PIPELINES
    return "parameters" if stages > 1 and (fw.startswith("megatron-deepspeed") or uneven) \
        else "uniform"


def _layout_problem(point: Point, fw: str) -> str:
    """Why a reading of a row is not a layout the model can price, or the framework ``fw``
    can run ("" when it is)."""
    if not isinstance(point.dp, int) or not isinstance(point.grad_accum, int):
        return (f"the batch does not split: global_batch={point.global_batch}, "
                f"micro_batch={point.micro_batch}, dp={point.dp}")
    if point.model.heads % point.tp:
        return f"heads={point.model.heads} do not split over tp={point.tp}"
    if (fw in EVEN_PIPELINES and point.parallel.virtual_stages > 1
            and point.grad_accum % point.pp):
        return (f"{fw}'s interleaved schedule needs the {point.grad_accum} micro-batches to "
                f"divide by pp={point.pp}")
    return partition.problem(point) or ""


def _point(r, base: dict, f: dict, fw: str, tp: int, pp: int, dp: int, cp: int) -> Point:
    """The point of one reading ``f`` of a row's fields."""
    llama = str(r["arch"]).lower() == "llama"
    model = Model(name=f"{base['table']}-{base['row']}"[:60].replace(" ", "-"),
                  arch="llama" if llama else "gpt", layers=_int_or(r["layers"]),
                  hidden=_int_or(r["hidden"]), heads=f["heads"], kv_heads=_int_or(r["kv_heads"]),
                  ffn_hidden=_int_or(r["ffn_hidden"]), vocab=f["vocab"],
                  seq_len=_int_or(r["seq_len"]), tied_embeddings=not llama,
                  attention="fused" if _flag(f["flash_attention"]) else "math",
                  mlp=str(r.get("mlp", OPTIONAL["mlp"])).strip().lower() or None)
    vp = f["vp"] if pp > 1 else 1
    return Point.build(
        model, n=tp * pp * dp * cp, tp=tp, pp=pp, cp=cp, micro_batch=f["micro_batch"],
        global_batch=f["global_batch"],
        parallel=Parallel(dp_mode=DP_MODE.get(f["dp_mode"], "ddp"),
                          activation_checkpointing=(RECOMPUTE_TORCH if fw.startswith("torchtitan")
                                                    else RECOMPUTE)[f["recompute"]],
                          sequence_parallel=_flag(r["sequence_parallel"]) and tp > 1,
                          virtual_stages=vp,
                          # DeepSpeed's PipelineModule partitions by parameters by default
                          pp_partition=partition_of(fw, _int_or(r["layers"]), pp * vp),
                          pp_schedule="interleaved1f1b" if vp > 1 else "1f1b"),
        train=Train(precision="bf16", compile=_flag(r.get("compile", OPTIONAL["compile"]))),
        platform=Platform(device="cuda", hardware=str(r["device"]), devices_per_node=8),
        study="validation", series=base["table"][:60], mode="strong")


def convention_flops(point: Point, convention: str) -> float:
    """Model FLOPs per step under a row's convention (``CONVENTIONS``)."""
    gb = point.global_batch
    if convention == "palm":
        return flops.model_flops_per_step(point.model, gb, "palm")
    if convention == "megatron_recompute":
        return flops.hardware_flops_per_step(point.model, gb, "megatron",
                                             point.parallel.activation_checkpointing)
    return flops.model_flops_per_step(point.model, gb)


def predicted_value(metric: str, convention: str, p: Point, b: StepBreakdown,
                    peak: float) -> float:
    """The model's figure in a row's ``metric`` (read in its FLOPs ``convention``) from the
    step breakdown ``b`` of point ``p`` (``peak``: the device's dense bf16 peak, FLOP/s)."""
    t = b.step_time_s
    if metric == "iteration_s":
        return t
    if metric == "tokens_per_s_per_gpu":
        return p.tokens_per_step / (t * p.n)
    f = b.hardware_flops_per_step if metric == "hfu_pct" else convention_flops(p, convention)
    if metric in ("mfu_pct", "hfu_pct"):
        return 100 * f / (t * p.n * peak)
    return f / (t * p.n) / 1e12  # tflops_per_gpu


def error(metric: str, predicted: float, published: float) -> float:
    """Relative error, positive when the model is optimistic (module doc)."""
    e = predicted / published - 1.0
    return -e if metric == "iteration_s" else e


def systems(overrides: dict | None = None) -> dict[tuple, HardwareSpec]:
    """A cache of ``(system, framework[, fp8 speed-up]) -> HardwareSpec``; ``overrides`` sets
    assumptions (``{name: value}``) on every GPU system (the fit varies the shared constants)."""
    return _Systems(overrides or {})


class _Systems(dict):
    def __init__(self, overrides: dict):
        super().__init__()
        self.overrides = overrides

    def __missing__(self, key):
        system, fw, *fp8 = key
        if fp8 and fp8[0] != 1.0:
            hw = fp8_products(self[(system, fw)], fp8[0])
        else:
            hw = HardwareSpec.load(system).with_framework(fw)
            for name, value in self.overrides.items():
                hw = hw.with_assumption(name, value)
        self[key] = hw
        return hw


def fp8_products(hw: HardwareSpec, speedup: float) -> HardwareSpec:
    """``hw`` with its 16-bit matrix products ``speedup`` times faster (fp8 products) and its
    fused attention kernel as fast as before (it stays in bf16)."""
    from dataclasses import replace

    peaks = {**hw.peak_flops, "bf16": hw.peak("bf16") * speedup}
    return replace(hw, peak_flops=peaks,
                   attention_efficiency=(hw.attention_efficiency / speedup
                                         if hw.attention_efficiency else hw.attention_efficiency))


def readings(c: Case, specs) -> list[tuple[float, Variant, StepBreakdown]]:
    """``(value, variant, breakdown)`` of every reading of a case, by value: the model's
    figure in the row's metric and convention (``predicted_value``)."""
    vals = []
    for v in c.variants:
        b = stepmodel.predict_step_time(v.point, specs[(c.system, v.framework, v.fp8_speedup)])
        peak = specs[(c.system, v.framework)].peak("bf16")
        vals.append((predicted_value(c.metric, v.convention, v.point, b, peak), v, b))
    return sorted(vals, key=lambda x: x[0])


def predict_case(c: Case, specs, ranges: bool = True) -> dict:
    """One case's row of the validation table, or its skip reason: ``predicted`` (the
    central reading: the variant whose figure is the median of the variants'), its range
    ``predicted_low`` / ``predicted_high`` (the envelope over the variants, widened by the
    central variant's spread over ``hw.scenarios()``, the two taken as independent factors),
    ``inside`` (the published value in that range), ``ranged`` (the fields the table leaves
    unsaid), ``error`` of the central value and the central breakdown's main fractions."""
    out = {"table": c.table, "row": c.row, "metric": c.metric, "published": c.published,
           "system": c.system, "framework": c.framework, "series": c.series,
           "scaling": c.scaling, "ranged": " ".join(c.ranged), "variants": len(c.variants),
           "skip": c.skip}
    if c.skip:
        return out
    vals = readings(c, specs)
    pred, v, b = vals[(len(vals) - 1) // 2]
    lo, hi = vals[0][0], vals[-1][0]
    if ranges:
        pr = stepmodel.predict_range(v.point, specs[(c.system, v.framework, v.fp8_speedup)])
        t, t_lo, t_hi = b.step_time_s, pr.step_time_low_s, pr.step_time_high_s
        lo, hi = ((lo * t_lo / t, hi * t_hi / t) if c.metric == "iteration_s"
                  else (lo * t / t_hi, hi * t / t_lo))
    fr = b.fractions()
    out.update({"framework": v.framework, "n": v.point.n, "tp": v.point.tp, "pp": v.point.pp,
                "dp": v.point.dp, "predicted": pred, "predicted_low": lo, "predicted_high": hi,
                "inside": bool(lo <= c.published <= hi), "width": (hi - lo) / pred,
                "error": error(c.metric, pred, c.published),
                "step_time_s": b.step_time_s, "mfu_pct": 100 * b.mfu,
                "compute_pct": 100 * (fr["gemm_s"] + fr["attention_s"]),
                "memory_bound_pct": 100 * fr["elementwise_s"],
                "overhead_pct": 100 * fr["overhead_s"],
                "comm_pct": 100 * (fr["tp_comm_s"] + fr["pp_p2p_s"] + fr["dp_comm_exposed_s"]),
                "bubble_pct": 100 * fr["pp_bubble_s"]})
    return out


def cases(names: list[str] | None = None) -> list[Case]:
    """Every row of the named tables (default: all shipped) as cases."""
    out = []
    for name in names or table_names():
        if name == FRONTIER:
            continue
        for _, r in load_table(name).iterrows():
            out.append(case(r))
    return out


def frontier_rows(specs, ranges: bool = True) -> list[dict]:
    """The Frontier study's published figures against the model (``frontier.run`` on the
    ``frontier`` system): both means of the logged lines, the weak and both strong series."""
    _, comp, _ = frontier.run(specs[("frontier", "megatron-deepspeed")], ranges=ranges)
    return [{"table": FRONTIER, "row": f"{r.model} {r.metric}", "metric": r.metric,
             "published": r.published, "system": "frontier", "framework": "megatron-deepspeed",
             "ranged": "", "variants": 1, "skip": "", "n": r.n, "predicted": r.predicted,
             "predicted_low": r.predicted_low, "predicted_high": r.predicted_high,
             "inside": r.inside, "width": (r.predicted_high - r.predicted_low) / r.predicted,
             "error": r.rel_error}
            for r in comp.itertuples()]


def validate(names: list[str] | None = None, overrides: dict | None = None,
             all_cases: list[Case] | None = None, ranges: bool = True,
             published_layouts_only: bool = False):
    """The per-row validation table (a DataFrame; skipped rows carry their reason) of the
    named tables (default: all), with ``overrides`` of the shared GPU constants. ``ranges``:
    the scenario envelope too (off: central values only, as fast as a fit needs);
    ``published_layouts_only``: only the rows whose whole layout the table gives."""
    import pandas as pd

    specs = systems(overrides)
    names = names or table_names()
    todo = all_cases if all_cases is not None else cases(names)
    if published_layouts_only:
        todo = [c for c in todo if not c.ranged]
    rows = [predict_case(c, specs, ranges) for c in todo]
    if FRONTIER in names:
        rows += frontier_rows(specs, ranges)
    return pd.DataFrame(rows)


def summary(rows):
    """Per table: rows modelled and skipped, MAPE, signed bias and the worst row of the
    central values (fractions), ``coverage`` (the fraction of rows whose published value lies
    inside the predicted range) and ``median_width`` (the range's median width over the
    central value), and, where the rows say so, whether they were in the fit (``in_fit``)."""
    import pandas as pd

    out = []
    for table, sub in rows.groupby("table", sort=True):
        ok = sub[sub["skip"] == ""]
        if ok.empty:
            out.append({"table": table, "rows": 0, "skipped": len(sub)})
            continue
        worst = ok.loc[ok["error"].abs().idxmax()]
        rec = {"table": table, "rows": len(ok), "skipped": len(sub) - len(ok),
               "mape": float(ok["error"].abs().mean()), "bias": float(ok["error"].mean()),
               "worst_row": worst["row"], "worst_error": float(worst["error"])}
        if "inside" in ok and ok["inside"].notna().all():
            rec["coverage"] = float(ok["inside"].astype(bool).mean())
            rec["median_width"] = float(ok["width"].median())
        if "in_fit" in ok:
            rec["in_fit"] = bool(ok["in_fit"].all())
        out.append(rec)
    return pd.DataFrame(out)


def log_error(e: float) -> float:
    """``|log(1 + e)|``: the symmetric size of a relative error (for fitting)."""
    return abs(math.log1p(e))
