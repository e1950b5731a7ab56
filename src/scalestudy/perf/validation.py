"""The step model against published training throughput: every row of every shipped table
(``data/published/*.csv``, one schema; sources in ``data/published/README.md``) becomes a
``Point`` on the system of its device, driven by the framework family it ran, and the model's
figure in the row's own metric and FLOPs convention is set against the published one.

Pure: no figures, no files written (``scalestudy predict --validate`` prints and draws).

The row schema (``COLUMNS``): the layout (``tp, pp, dp, cp, vp, micro_batch, global_batch,
sequence_parallel, recompute, dp_mode``), the model (``arch, layers, hidden, heads, kv_heads,
ffn_hidden, vocab, seq_len``), ``metric`` (``tflops_per_gpu``, ``mfu_pct``, ``hfu_pct``,
``tokens_per_s_per_gpu``, ``iteration_s``) with its ``value`` and ``flops_convention``, and
``log_note``. A row the model cannot express (fp8 products, context parallelism, an unknown
device) is kept with the reason (``skip``), never silently dropped.

Errors are relative, ``predicted / published - 1`` (a throughput too high is positive; for
``iteration_s`` a step too long is positive, so the sign is flipped to keep "positive = the
model is optimistic" for every metric). Per table: MAPE (mean of ``|error|``), signed bias
(mean error) and the worst row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

from scalestudy.config.point import Model, Parallel, Platform, Point, Train
from scalestudy.perf import flops, frontier, stepmodel
from scalestudy.perf.hardware import HardwareSpec

COLUMNS = ("table", "row", "device", "gpus", "framework", "arch", "params_b", "layers", "hidden",
           "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len", "tp", "pp", "dp", "cp", "vp",
           "sequence_parallel", "micro_batch", "global_batch", "recompute", "dp_mode",
           "flash_attention", "precision", "metric", "value", "flops_convention", "peak_tflops",
           "log_note", "source")
#: Optional columns and their defaults: ``compile`` (the model ran under torch.compile),
#: ``steady_state`` (``false``: the figure is not a steady-state measurement, e.g. one early
#: iteration of a benchmark, and is kept but not modelled).
#: ``convention_stated`` (``false``: the source does not say how it counts FLOPs, so its
#: FLOPs-based figures are kept but not modelled).
#: ``system``: the preset of the machine the row ran on, where it is not the one its device
#: maps to (``SYSTEM_OF_DEVICE``).
OPTIONAL = {"compile": "false", "steady_state": "true", "convention_stated": "true",
            "system": ""}
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


#: The Frontier study's table: its own reference data and series (``scalestudy.perf.frontier``).
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


def _int(x, default=None):
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
class Case:
    """A published row as the model sees it: the point, the system and framework it is
    predicted on, or why it cannot be (``skip``)."""

    table: str
    row: str
    metric: str
    published: float
    convention: str
    point: Point | None = None
    system: str = ""
    framework: str = ""
    skip: str = ""


def case(r) -> Case:
    """A table row (a mapping of ``COLUMNS``) as a ``Case``."""
    base = dict(table=str(r["table"]), row=str(r["row"]), metric=str(r["metric"]),
                published=float(r["value"]), convention=str(r["flops_convention"]))
    if base["metric"] not in METRICS:
        return Case(**base, skip=f"metric {base['metric']!r} is not modelled")
    system = str(r.get("system", "")).strip() or system_of(r["device"])
    if system is None:
        return Case(**base, skip=f"device {r['device']!r} has no system preset")
    if str(r["precision"]).lower() == "fp8":
        return Case(**base, skip="fp8 products are not modelled")
    if (_int(r["cp"], 1) or 1) > 1:
        return Case(**base, skip="context parallelism is not modelled")
    if not _flag(r.get("steady_state", OPTIONAL["steady_state"])):
        return Case(**base, skip="not a steady-state figure (see its log_note)")
    if base["metric"] in FLOPS_METRICS and not _flag(
            r.get("convention_stated", OPTIONAL["convention_stated"])):
        return Case(**base, skip="the source does not say how it counts FLOPs")
    if (_int(r["pp"], 1) or 1) > 1 and _int(r["vp"]) is None:
        return Case(**base, skip="the table does not give the pipeline's virtual stages "
                                 "(interleaving), on which its bubble depends")
    need = ("layers", "hidden", "heads", "vocab", "seq_len", "tp", "pp", "dp", "micro_batch",
            "global_batch")
    missing = [k for k in need if _int(r[k]) is None]
    missing += [k for k in ("recompute",) if str(r[k]).strip() == ""]
    if (_int(r["dp"]) or 1) > 1 and str(r["dp_mode"]).strip() == "":
        missing.append("dp_mode")
    if missing:
        return Case(**base, skip=f"the table does not give {', '.join(missing)}")
    try:
        fw = framework_of(r["framework"], r["precision"])
    except ValueError as e:
        return Case(**base, skip=str(e))
    llama = str(r["arch"]).lower() == "llama"
    model = Model(name=f"{base['table']}-{base['row']}"[:60].replace(" ", "-"),
                  arch="llama" if llama else "gpt", layers=_int(r["layers"]),
                  hidden=_int(r["hidden"]), heads=_int(r["heads"]),
                  kv_heads=_int(r["kv_heads"]), ffn_hidden=_int(r["ffn_hidden"]),
                  vocab=_int(r["vocab"]), seq_len=_int(r["seq_len"]),
                  tied_embeddings=not llama,
                  attention="fused" if _flag(r["flash_attention"]) else "math")
    tp, pp, dp = _int(r["tp"]), _int(r["pp"]), _int(r["dp"])
    mb = _int(r["micro_batch"])
    gb = _int(r["global_batch"])
    vp = _int(r["vp"], 1) or 1
    point = Point.build(
        model, n=tp * pp * dp, tp=tp, pp=pp, micro_batch=mb, global_batch=gb,
        parallel=Parallel(dp_mode=DP_MODE.get(str(r["dp_mode"]).lower(), "ddp"),
                          activation_checkpointing=(RECOMPUTE_TORCH if fw.startswith("torchtitan")
                                                    else RECOMPUTE)[str(r["recompute"]).lower()],
                          sequence_parallel=_flag(r["sequence_parallel"]) and tp > 1,
                          virtual_stages=vp if pp > 1 else 1,
                          # DeepSpeed's PipelineModule partitions by parameters by default
                          pp_partition=("parameters" if fw.startswith("megatron-deepspeed")
                                        and pp > 1 else "uniform"),
                          pp_schedule="interleaved1f1b" if (pp > 1 and vp > 1) else "1f1b"),
        train=Train(precision="bf16", compile=_flag(r.get("compile", OPTIONAL["compile"]))),
        platform=Platform(device="cuda", hardware=str(r["device"]), devices_per_node=8),
        study="validation", series=base["table"][:60], mode="strong")
    return Case(**base, point=point, system=system, framework=fw)


def convention_flops(point: Point, convention: str) -> float:
    """Model FLOPs per step under a row's convention (``CONVENTIONS``)."""
    gb = point.global_batch
    if convention == "palm":
        return flops.model_flops_per_step(point.model, gb, "palm")
    if convention == "megatron_recompute":
        return flops.hardware_flops_per_step(point.model, gb, "megatron",
                                             point.parallel.activation_checkpointing)
    return flops.model_flops_per_step(point.model, gb)


def predicted_value(c: Case, b: stepmodel.StepBreakdown, peak: float) -> float:
    """The model's figure in the row's metric from its step breakdown ``b`` (``peak``: the
    device's dense bf16 peak, FLOP/s)."""
    p, t = c.point, b.step_time_s
    if c.metric == "iteration_s":
        return t
    if c.metric == "tokens_per_s_per_gpu":
        return p.tokens_per_step / (t * p.n)
    f = (b.hardware_flops_per_step if c.metric == "hfu_pct"
         else convention_flops(p, c.convention))
    if c.metric in ("mfu_pct", "hfu_pct"):
        return 100 * f / (t * p.n * peak)
    return f / (t * p.n) / 1e12  # tflops_per_gpu


def error(metric: str, predicted: float, published: float) -> float:
    """Relative error, positive when the model is optimistic (module doc)."""
    e = predicted / published - 1.0
    return -e if metric == "iteration_s" else e


def systems(overrides: dict | None = None) -> dict[tuple[str, str], HardwareSpec]:
    """A cache of ``(system, framework) -> HardwareSpec``; ``overrides`` sets assumptions
    (``{name: value}``) on every GPU system (the fit varies the shared constants)."""
    return _Systems(overrides or {})


class _Systems(dict):
    def __init__(self, overrides: dict):
        super().__init__()
        self.overrides = overrides

    def __missing__(self, key):
        system, fw = key
        hw = HardwareSpec.load(system).with_framework(fw)
        for name, value in self.overrides.items():
            hw = hw.with_assumption(name, value)
        self[key] = hw
        return hw


def predict_case(c: Case, specs) -> dict:
    """One case's row of the validation table (``predicted``, ``error``, the breakdown's
    main fractions), or its skip reason."""
    out = {"table": c.table, "row": c.row, "metric": c.metric, "published": c.published,
           "system": c.system, "framework": c.framework, "skip": c.skip}
    if c.skip:
        return out
    hw = specs[(c.system, c.framework)]
    b = stepmodel.predict_step_time(c.point, hw)
    pred = predicted_value(c, b, hw.peak("bf16"))
    fr = b.fractions()
    out.update({"n": c.point.n, "tp": c.point.tp, "pp": c.point.pp, "dp": c.point.dp,
                "predicted": pred, "error": error(c.metric, pred, c.published),
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


def frontier_rows(specs) -> list[dict]:
    """The Frontier study's published figures against the model (``frontier.run`` on the
    ``frontier`` system, central values): both means of the logged lines, the weak and both
    strong series."""
    _, comp, _ = frontier.run(specs[("frontier", "megatron-deepspeed")], ranges=False)
    return [{"table": FRONTIER, "row": f"{r.model} {r.metric}", "metric": r.metric,
             "published": r.published, "system": "frontier", "framework": "megatron-deepspeed",
             "skip": "", "n": r.n, "predicted": r.predicted, "error": r.rel_error}
            for r in comp.itertuples()]


def validate(names: list[str] | None = None, overrides: dict | None = None,
             all_cases: list[Case] | None = None):
    """The per-row validation table (a DataFrame; skipped rows carry their reason) of the
    named tables (default: all), with ``overrides`` of the shared GPU constants."""
    import pandas as pd

    specs = systems(overrides)
    names = names or table_names()
    rows = [predict_case(c, specs) for c in (all_cases if all_cases is not None else cases(names))]
    if FRONTIER in names:
        rows += frontier_rows(specs)
    return pd.DataFrame(rows)


def summary(rows):
    """Per table: rows modelled and skipped, MAPE, signed bias and the worst row (fractions),
    and, where the rows say so, whether they were in the fit (``in_fit``)."""
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
        if "in_fit" in ok:
            rec["in_fit"] = bool(ok["in_fit"].all())
        out.append(rec)
    return pd.DataFrame(out)


def log_error(e: float) -> float:
    """``|log(1 + e)|``: the symmetric size of a relative error (for fitting)."""
    return abs(math.log1p(e))
