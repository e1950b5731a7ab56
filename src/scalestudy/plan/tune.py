"""Rank the feasible parallel shapes of a model on N devices by predicted throughput, and
write the best k as a study the user can run (``scalestudy tune``: ``scalestudy.commands.tune``).

The search is exhaustive over (tp, pp, micro-batch, and the tuned settings' declared values:
schedule, virtual stages, dp_mode, activation checkpointing) under the constraints the trainer has: ``N = dp·tp·pp``, ``tp``
divides heads and hidden and fits in a node, ``layers`` split into ``pp × virtual`` stages,
at least ``pp`` micro-batches for a pipelined schedule, ``global_batch`` a multiple of
``dp × micro_batch``, and the memory estimate within ``headroom`` of the device. Each shape
is scored by ``stepmodel.predict_step_time`` (the Frontier study used Bayesian search with
DeepHyper for this step; the feasible set here is small enough to enumerate).
"""

from __future__ import annotations

import dataclasses

from scalestudy.config import limits
from scalestudy.config.devices import device_key
from scalestudy.config.point import Point
from scalestudy.config.parts import (SERIES_SETTINGS, TUNED_SETTINGS, Model, Parallel, Platform,
                                     Train, json_value)
from scalestudy.config.presets import LLAMA3
from scalestudy.config.study_yaml import dump_study
from scalestudy.config.vocab import DPMode, PPSchedule
from scalestudy.perf import memory, stepmodel
from scalestudy.perf.hardware import HardwareSpec
from scalestudy.perf.rates import Measured
from scalestudy.plan import constraints
from scalestudy.reference_data import load

TINY = Model(name="tiny", vocab=256, seq_len=64, layers=4, hidden=64, heads=4)


def known_models() -> dict[str, tuple[Model, int | None]]:
    """``{name: (model, global batch or None)}``: ``tiny``, the published references
    (gpt-22b / 175b / 1t, with the global batch of the authors' launch scripts) and the
    Llama 3 shapes (llama3-8b / 70b / 405b, ``scalestudy.config.presets``; no global batch:
    give ``--global-batch``)."""
    out: dict[str, tuple[Model, int | None]] = {"tiny": (TINY, None)}
    pub, cfg = load("frontier_dash2024"), load("frontier_dash2024_configs")
    for r in pub.itertuples():
        c = cfg[cfg["model"] == r.model]
        # untied: the trainer's pipeline stages cannot share the embedding with the head
        # (Megatron ties them); the untied head adds V*h parameters on the last stage
        out[r.model] = (Model(name=r.model, vocab=int(r.vocab), seq_len=int(r.seq_len),
                              layers=int(r.layers), hidden=int(r.hidden), heads=int(r.heads)),
                        int(c["global_batch"].iloc[0]) if not c.empty else None)
    out.update({name: (model, None) for name, model in LLAMA3.items()})
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: Model, n: int, global_batch: int, hw: HardwareSpec,
               precision: str = "bf16", micro_batches=(1, 2, 4, 8),
               dp_modes=TUNED_SETTINGS["dp_mode"],
               checkpointing=TUNED_SETTINGS["activation_checkpointing"],
               headroom: float = constraints.MEMORY_HEADROOM):
    """Yield ``(point, feasible, reason)`` for every shape of ``model`` on ``n`` devices that
    keeps the constraints' shape rules (``feasible``: the memory estimate fits ``headroom``
    of the device). The schedules, virtual stages, dp modes and checkpointing are the tuned
    settings' declared values (``parts.TUNED_SETTINGS``)."""
    piped = [(s, v) for s in TUNED_SETTINGS["pp_schedule"]
             for v in TUNED_SETTINGS["virtual_stages"]]
    platform = Platform(device="cpu" if hw.device == "cpu" else "cuda",
                        devices_per_node=hw.devices_per_node,
                        max_nodes=limits.MAX_NODES_PER_POINT)
    train = Train(precision=precision)
    for tp in _divisors(n):
        if tp > hw.devices_per_node:
            continue
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            # (one stage per rank without a pipeline; the constraints refuse the pairs that
            # contradict each other: interleaving with one stage, several without it)
            scheds = [(PPSchedule.ONE_F_ONE_B, 1)] if pp == 1 else piped
            for mb in micro_batches:
                for sched, v in scheds:
                    for mode in (dp_modes if dp > 1 else (DPMode.DDP,)):
                        for ckpt in checkpointing:
                            point = Point.build(
                                model, n=n, tp=tp, pp=pp, micro_batch=mb,
                                global_batch=global_batch, platform=platform, train=train,
                                parallel=Parallel(dp_mode=mode, pp_schedule=sched,
                                                  virtual_stages=v,
                                                  activation_checkpointing=ckpt))
                            if constraints.violation(point):
                                continue
                            ok, reason = memory.fits(point, hw.memory_bytes, headroom)
                            yield point, ok, reason


def rank(model: Model, n: int, global_batch: int, hw: HardwareSpec, top: int = 5,
         precision: str = "bf16", measured: Measured | None = None, **kw) -> list[dict]:
    """The ``top`` feasible shapes by predicted tokens/s, best first: dicts with ``point``,
    ``prediction`` (a ``breakdown.StepBreakdown``) and ``memory_bytes``."""
    scored = []
    for point, ok, _ in candidates(model, n, global_batch, hw, precision, **kw):
        if not ok:
            continue
        pred = stepmodel.predict_step_time(point, hw, measured)
        scored.append({"point": point, "prediction": pred,
                       "memory_bytes": memory.estimate(point)["total_bytes"]})
    scored.sort(key=lambda r: (-r["prediction"].tokens_per_s, r["memory_bytes"]))
    return scored[:top]


def study_yaml(model: Model, best: list[dict], hw: HardwareSpec) -> str:
    """A study file (``study.schema.json``) with one strong-scaling series of one point per
    ranked shape; the prediction of each is in a comment beside it."""
    mname = model.name.replace(" ", "-")
    series, notes = [], []
    for i, r in enumerate(best, 1):
        p, q = r["point"], r["prediction"]
        par = p.parallel
        sname = f"rank{i}-tp{p.tp}-pp{p.pp}-mb{p.micro_batch}"
        series.append({
            "name": sname, "mode": "strong", "model": mname, "gpus": [p.n],
            "tp": p.tp, "pp": p.pp, "micro_batch": p.micro_batch,
            "global_batch": p.global_batch,
            # every tuned setting, as the point holds it
            **{k: json_value(getattr(getattr(p, SERIES_SETTINGS[k]), k))
               for k in TUNED_SETTINGS},
        })
        notes.append(f"#   {sname}: {par.pp_schedule} v={par.virtual_stages} {par.dp_mode} "
                     f"ckpt={par.activation_checkpointing}: predicted {q.step_time_s:.4g} "
                     f"s/step, {q.tokens_per_s:.4g} tokens/s, MFU {q.mfu:.1%}, "
                     f"memory {memory.fmt_bytes(r['memory_bytes'])}")
    n_max = max(r["point"].n for r in best)
    shape = {k: (str(v) if isinstance(v, str) else v)
             for k, v in dataclasses.asdict(model).items() if k != "name"}
    doc = {
        "name": f"tune-{mname}-n{n_max}"[:64],
        "description": f"top {len(best)} shapes by predicted throughput on {hw.name} (scalestudy tune)",
        "models": {mname: shape},
        "train": {"precision": str(best[0]["point"].train.precision)},
        "platform": {
            "device": "cpu" if hw.device == "cpu" else "cuda",
            "hardware": device_key(hw.device),
            "devices_per_node": hw.devices_per_node,
            "max_nodes": max(1, -(-n_max // hw.devices_per_node)),
            "memory_per_device_gb": round(hw.memory_bytes / 1e9, 3),
        },
        "series": series,
    }
    head = (f"# Written by `scalestudy tune` for hardware {hw.name}: the top {len(best)} shapes by "
            "predicted throughput.\n# Run it (scalestudy run) and compare with the predictions:\n"
            + "\n".join(notes) + "\n")
    return head + dump_study(doc, sort_keys=False)
