"""``scalestudy tune``: rank the feasible parallel shapes of a model on N devices by
predicted throughput, and write the best k as a study the user can run.

    scalestudy tune --model gpt-175b --n 1024 --hardware frontier [--global-batch 1280]
        [--top 5] [--out study.yaml]

The search is exhaustive over (tp, pp, micro-batch, schedule, virtual stages, dp_mode,
activation checkpointing) under the constraints the trainer has: ``N = dp·tp·pp``, ``tp``
divides heads and hidden and fits in a node, ``layers`` split into ``pp × virtual`` stages,
at least ``pp`` micro-batches for a pipelined schedule, ``global_batch`` a multiple of
``dp × micro_batch``, and the memory estimate within ``headroom`` of the device. Each shape
is scored by ``stepmodel.predict_step_time`` (the Frontier study used Bayesian search with
DeepHyper for this step; the feasible set here is small enough to enumerate).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from scalestudy.config.point import Model, Parallel, Platform, Point, Train
from scalestudy.config.vocab import Checkpointing, DPMode, PPSchedule
from scalestudy.perf import memory
from scalestudy.perf import stepmodel
from scalestudy.plan import constraints

TINY = Model(name="tiny", vocab=256, seq_len=64, layers=4, hidden=64, heads=4)


def known_models() -> dict[str, tuple[Model, int | None]]:
    """``{name: (model, global batch or None)}``: ``tiny``, the published references
    (gpt-22b / 175b / 1t, with the global batch of the authors' launch scripts) and the
    Llama 3 shapes (llama3-8b / 70b / 405b, ``scalestudy.models.presets``; no global batch:
    give ``--global-batch``)."""
    from scalestudy.models.presets import LLAMA3
    from scalestudy.reference_data import load

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


def candidates(model: Model, n: int, global_batch: int, hw: stepmodel.HardwareSpec,
               precision: str = "bf16", micro_batches=(1, 2, 4, 8),
               dp_modes=tuple(DPMode), checkpointing=(Checkpointing.NONE, Checkpointing.FULL),
               headroom: float = constraints.MEMORY_HEADROOM):
    """Yield ``(point, feasible, reason)`` for every shape of ``model`` on ``n`` devices that
    keeps the constraints' shape rules (``feasible``: the memory estimate fits ``headroom``
    of the device)."""
    platform = Platform(device="cpu" if hw.device == "cpu" else "cuda",
                        devices_per_node=hw.devices_per_node, max_nodes=10**9)
    train = Train(precision=precision)
    for tp in _divisors(n):
        if tp > hw.devices_per_node:
            continue
        for pp in _divisors(n // tp):
            dp = n // (tp * pp)
            scheds = [(PPSchedule.ONE_F_ONE_B, 1)] if pp == 1 else [
                (PPSchedule.GPIPE, 1), (PPSchedule.ONE_F_ONE_B, 1)] + [
                (PPSchedule.INTERLEAVED_1F1B, v) for v in (2, 4)]
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


def rank(model: Model, n: int, global_batch: int, hw: stepmodel.HardwareSpec, top: int = 5,
         precision: str = "bf16", measured: stepmodel.Measured | None = None, **kw) -> list[dict]:
    """The ``top`` feasible shapes by predicted tokens/s, best first: dicts with ``point``,
    ``prediction`` (a ``stepmodel.StepBreakdown``) and ``memory_bytes``."""
    scored = []
    for point, ok, _ in candidates(model, n, global_batch, hw, precision, **kw):
        if not ok:
            continue
        pred = stepmodel.predict_step_time(point, hw, measured)
        scored.append({"point": point, "prediction": pred,
                       "memory_bytes": memory.estimate(point)["total_bytes"]})
    scored.sort(key=lambda r: (-r["prediction"].tokens_per_s, r["memory_bytes"]))
    return scored[:top]


def study_yaml(model: Model, best: list[dict], hw: stepmodel.HardwareSpec) -> str:
    """A study file (``study.schema.yaml``) with one strong-scaling series of one point per
    ranked shape; the prediction of each is in a comment beside it."""
    from scalestudy.perf.hardware import device_key

    mname = model.name.replace(" ", "-")
    series, notes = [], []
    for i, r in enumerate(best, 1):
        p, q = r["point"], r["prediction"]
        par = p.parallel
        sname = f"rank{i}-tp{p.tp}-pp{p.pp}-mb{p.micro_batch}"
        series.append({
            "name": sname, "mode": "strong", "model": mname, "gpus": [p.n],
            "tp": p.tp, "pp": p.pp, "micro_batch": p.micro_batch,
            "global_batch": p.global_batch, "dp_mode": str(par.dp_mode),
            "pp_schedule": str(par.pp_schedule), "virtual_stages": par.virtual_stages,
            "activation_checkpointing": str(par.activation_checkpointing),
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
    from scalestudy.config.study import dump_study

    return head + dump_study(doc, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="scalestudy tune", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Rank the feasible parallel shapes (tp, pp, micro-batch, schedule, sharding,\n"
                    "checkpointing) of a model on N devices by predicted throughput, and write the\n"
                    "best k as a study you can run.",
        epilog="example:\n"
               "  scalestudy tune --model gpt-175b --n 1024 --hardware frontier --top 5 "
               "--out top5.yaml")
    ap.add_argument("--model", required=True,
                    help="tiny | gpt-22b | gpt-175b | gpt-1t | llama3-8b | llama3-70b | "
                         "llama3-405b | model YAML")
    ap.add_argument("--n", type=int, required=True, help="number of devices")
    ap.add_argument("--hardware", default="frontier", help="preset name or YAML path")
    ap.add_argument("--global-batch", type=int, default=None,
                    help="sequences per optimizer step (default: the model's published batch, "
                         "else 8 × N)")
    ap.add_argument("--precision", default=None, help="bf16 (default on accelerators) or fp32")
    ap.add_argument("--top", type=int, default=5, help="how many shapes to keep (default 5)")
    ap.add_argument("--matmul-csv", default=None,
                    help="microbench matmul CSV measured on that hardware")
    ap.add_argument("--collectives-csv", default=None,
                    help="microbench collectives CSV measured on that hardware")
    ap.add_argument("--out", default=None, help="write the top k as a study YAML here")
    a = ap.parse_args(argv)

    models = known_models()
    if a.model in models:
        model, model_gb = models[a.model]
    else:
        import os

        import yaml

        if not os.path.exists(a.model):
            print(f"--model {a.model!r}: not a known model ({', '.join(models)}) nor a YAML file",
                  file=sys.stderr)
            return 2
        with open(a.model) as f:
            shape = yaml.safe_load(f)
        model_gb = shape.pop("global_batch", None)
        model = Model(**{"name": os.path.splitext(os.path.basename(a.model))[0], **shape})
    hw = stepmodel.HardwareSpec.load(a.hardware)
    precision = a.precision or ("fp32" if "bf16" not in hw.peak_flops or hw.device == "cpu" else "bf16")
    gb = a.global_batch or model_gb or 8 * a.n
    measured = (stepmodel.Measured.from_csv(a.matmul_csv, a.collectives_csv)
                if (a.matmul_csv or a.collectives_csv) else None)
    best = rank(model, a.n, gb, hw, a.top, precision, measured)
    if not best:
        print(f"no feasible shape for {model.name} on {a.n} devices of {hw.name} "
              f"(global batch {gb}); try more devices or a smaller micro-batch", file=sys.stderr)
        return 1
    print(f"{'rank':>4} {'tp':>3} {'pp':>4} {'dp':>4} {'mb':>3} {'sched':>11} {'v':>2} {'dp_mode':>12} "
          f"{'ckpt':>5} {'step_s':>10} {'tok/s':>10} {'MFU':>6} {'mem':>10}")
    for i, r in enumerate(best, 1):
        p, q, par = r["point"], r["prediction"], r["point"].parallel
        print(f"{i:>4} {p.tp:>3} {p.pp:>4} {p.dp:>4} {p.micro_batch:>3} "
              f"{par.pp_schedule:>11} {par.virtual_stages:>2} {par.dp_mode:>12} "
              f"{par.activation_checkpointing:>5} {q.step_time_s:>10.4g} {q.tokens_per_s:>10.4g} "
              f"{q.mfu:>6.1%} {memory.fmt_bytes(r['memory_bytes']):>10}")
    if a.out:
        from scalestudy.record.io import write_text

        write_text(a.out, study_yaml(model, best, hw))
        print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
