"""``scalestudy tune``: rank the feasible parallel shapes of a model on N devices by
predicted throughput, and write the best k as a study the user can run.

    scalestudy tune --model gpt-175b --n 1024 --hardware frontier [--global-batch 1280]
        [--top 5] [--out study.yaml]

The search is exhaustive over (tp, pp, micro-batch, schedule, virtual stages, dp_mode,
activation checkpointing) under the constraints the trainer has: ``N = dp·tp·pp``, ``tp``
divides heads and hidden and fits in a node, ``layers`` split into ``pp × virtual`` stages,
at least ``pp`` micro-batches for a pipelined schedule, ``global_batch`` a multiple of
``dp × micro_batch``, and the memory estimate within ``headroom`` of the device. Each shape
is scored by ``perfmodel.predict_step_time`` (the Frontier study used Bayesian search with
DeepHyper for this step; the feasible set here is small enough to enumerate).
"""

from __future__ import annotations

import argparse
import sys

from scalestudy import memory, perfmodel

TINY = {"name": "tiny", "vocab": 256, "seq_len": 64, "layers": 4, "hidden": 64, "heads": 4,
        "ffn_hidden": None, "mlp": "gelu", "tied_embeddings": False, "bias": True}


def known_models() -> dict:
    """Model configs by name: ``tiny`` and the published references (gpt-22b / 175b / 1t,
    with their global batch where known)."""
    from scalestudy.predict import reference

    out = {"tiny": dict(TINY)}
    try:
        pub = reference("frontier_dash2024")
        cfg = reference("frontier_dash2024_configs")
    except FileNotFoundError:
        return out
    for r in pub.itertuples():
        c = cfg[cfg["model"] == r.model]
        out[r.model] = {
            "name": r.model, "vocab": int(r.vocab), "seq_len": int(r.seq_len),
            "layers": int(r.layers), "hidden": int(r.hidden), "heads": int(r.heads),
            # untied: the trainer's pipeline stages cannot share the embedding with the head
            # (Megatron ties them); the untied head adds V*h parameters on the last stage
            "ffn_hidden": None, "mlp": "gelu", "tied_embeddings": False, "bias": True,
            "global_batch": int(c["global_batch"].iloc[0]) if not c.empty else None,
        }
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(model: dict, n: int, global_batch: int, hw: perfmodel.HardwareSpec,
               precision: str = "bf16", micro_batches=(1, 2, 4, 8),
               dp_modes=memory.DP_MODES, checkpointing=("none", "full"),
               headroom: float = 0.9):
    """Yield ``(point, feasible, reason)`` for every shape of ``model`` on ``n`` devices
    that passes the planner's constraints (``feasible``: the memory estimate fits)."""
    from scalestudy.planner import constraint_violation

    platform = {"devices_per_node": hw.devices_per_node, "max_nodes": 10**9}
    s, layers, heads, h = int(model["seq_len"]), int(model["layers"]), int(model["heads"]), int(model["hidden"])
    for tp in _divisors(n):
        if tp > hw.devices_per_node or heads % tp or h % tp:
            continue
        for pp in _divisors(n // tp):
            if layers % pp:
                continue
            dp = n // (tp * pp)
            scheds = [("1f1b", 1)] if pp == 1 else [("gpipe", 1), ("1f1b", 1)] + [
                ("interleaved1f1b", v) for v in (2, 4) if layers % (pp * v) == 0]
            for mb in micro_batches:
                if global_batch % (dp * mb):
                    continue
                m = global_batch // (dp * mb)
                for sched, v in scheds:
                    if pp > 1 and m < pp:
                        continue
                    for mode in (dp_modes if dp > 1 else ("ddp",)):
                        for ckpt in checkpointing:
                            point = {
                                "n": n, "dp": dp, "tp": tp, "pp": pp,
                                "nodes": -(-n // hw.devices_per_node),
                                "procs_per_node": min(n, hw.devices_per_node),
                                "micro_batch": mb, "grad_accum": m, "global_batch": global_batch,
                                "seq_len": s, "tokens_per_step": global_batch * s,
                                "model": {k: v2 for k, v2 in model.items() if k != "global_batch"},
                                "parallel": {"dp_mode": mode, "pp_schedule": sched,
                                             "virtual_stages": v, "sequence_parallel": False,
                                             "activation_checkpointing": ckpt},
                                "train": {"precision": precision},
                            }
                            point["mode"] = "strong"
                            model_full = {"tied_embeddings": False, **point["model"]}
                            if constraint_violation(point, model_full, platform):
                                continue
                            ok, reason = memory.fits(point, hw.memory_bytes, headroom)
                            yield point, ok, reason


def rank(model: dict, n: int, global_batch: int, hw: perfmodel.HardwareSpec, top: int = 5,
         precision: str = "bf16", measured: perfmodel.Measured | None = None, **kw) -> list[dict]:
    """The ``top`` feasible shapes by predicted tokens/s, best first: dicts with ``point``,
    ``prediction`` and ``memory_bytes``."""
    scored = []
    for point, ok, _ in candidates(model, n, global_batch, hw, precision, **kw):
        if not ok:
            continue
        pred = perfmodel.predict_step_time(point, hw, measured)
        scored.append({"point": point, "prediction": pred,
                       "memory_bytes": memory.estimate(point)["total_bytes"]})
    scored.sort(key=lambda r: (-r["prediction"]["tokens_per_s"], r["memory_bytes"]))
    return scored[:top]


MODEL_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "ffn_hidden", "mlp",
              "tied_embeddings", "bias")


def study_yaml(name: str, model: dict, best: list[dict], hw: perfmodel.HardwareSpec) -> str:
    """A study file (``study.schema.yaml``) with one strong-scaling series of one point per
    ranked shape; the prediction of each is in a comment beside it."""
    import yaml

    from scalestudy.hardware import load_peaks

    mname = str(model.get("name", "model")).replace(" ", "-")
    series, notes = [], []
    for i, r in enumerate(best, 1):
        p, par, q = r["point"], r["point"]["parallel"], r["prediction"]
        sname = f"rank{i}-tp{p['tp']}-pp{p['pp']}-mb{p['micro_batch']}"
        series.append({
            "name": sname, "mode": "strong", "model": mname, "gpus": [p["n"]],
            "tp": p["tp"], "pp": p["pp"], "micro_batch": p["micro_batch"],
            "global_batch": p["global_batch"], "dp_mode": par["dp_mode"],
            "pp_schedule": par["pp_schedule"], "virtual_stages": par["virtual_stages"],
            "activation_checkpointing": par["activation_checkpointing"],
        })
        notes.append(f"#   {sname}: {par['pp_schedule']} v={par['virtual_stages']} {par['dp_mode']} "
                     f"ckpt={par['activation_checkpointing']}: predicted {q['step_time_s']:.4g} s/step, "
                     f"{q['tokens_per_s']:.4g} tokens/s, MFU {q['mfu']:.1%}, "
                     f"memory {memory.fmt_bytes(r['memory_bytes'])}")
    peaks = set(load_peaks()["device"])
    cpu = hw.device == "cpu"
    n_max = max(p["point"]["n"] for p in best)
    doc = {
        "name": f"tune-{mname}-n{n_max}"[:64],
        "description": f"top {len(best)} shapes by predicted throughput on {hw.name} (scalestudy tune)",
        "models": {mname: {k: model[k] for k in MODEL_KEYS if k in model}},
        "train": {"precision": best[0]["point"]["train"]["precision"]},
        "platform": {
            "device": "cpu" if cpu else "cuda",
            "hardware": hw.device if hw.device in peaks else None,
            "devices_per_node": hw.devices_per_node,
            "max_nodes": max(1, -(-n_max // hw.devices_per_node)),
            "memory_per_device_gb": round(hw.memory_bytes / 1e9, 3),
        },
        "series": series,
    }
    head = (f"# Written by `scalestudy tune` for hardware {hw.name}: the top {len(best)} shapes by "
            "predicted throughput.\n# Run it (scalestudy run) and compare with the predictions:\n"
            + "\n".join(notes) + "\n")
    return head + yaml.safe_dump(doc, sort_keys=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalestudy tune", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="tiny | gpt-22b | gpt-175b | gpt-1t | model YAML")
    ap.add_argument("--n", type=int, required=True, help="number of devices")
    ap.add_argument("--hardware", default="frontier", help="preset name or YAML path")
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--precision", default=None, help="bf16 (default on accelerators) or fp32")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--matmul-csv", default=None)
    ap.add_argument("--collectives-csv", default=None)
    ap.add_argument("--out", default=None, help="write the top k as a study YAML here")
    a = ap.parse_args(argv)

    models = known_models()
    if a.model in models:
        model = models[a.model]
    else:
        import os

        import yaml

        if not os.path.exists(a.model):
            print(f"--model {a.model!r}: not a known model ({', '.join(models)}) nor a YAML file",
                  file=sys.stderr)
            return 2
        with open(a.model) as f:
            model = yaml.safe_load(f)
    hw = perfmodel.HardwareSpec.load(a.hardware)
    precision = a.precision or ("fp32" if "bf16" not in hw.peak_flops or hw.device == "cpu" else "bf16")
    gb = a.global_batch or model.get("global_batch") or 8 * a.n
    measured = (perfmodel.Measured.from_csv(a.matmul_csv, a.collectives_csv)
                if (a.matmul_csv or a.collectives_csv) else None)
    best = rank(model, a.n, gb, hw, a.top, precision, measured)
    if not best:
        print(f"no feasible shape for {model.get('name', a.model)} on {a.n} devices of {hw.name} "
              f"(global batch {gb}); try more devices or a smaller micro-batch", file=sys.stderr)
        return 1
    print(f"{'rank':>4} {'tp':>3} {'pp':>4} {'dp':>4} {'mb':>3} {'sched':>11} {'v':>2} {'dp_mode':>12} "
          f"{'ckpt':>5} {'step_s':>10} {'tok/s':>10} {'MFU':>6} {'mem':>10}")
    for i, r in enumerate(best, 1):
        p, q, par = r["point"], r["prediction"], r["point"]["parallel"]
        print(f"{i:>4} {p['tp']:>3} {p['pp']:>4} {p['dp']:>4} {p['micro_batch']:>3} "
              f"{par['pp_schedule']:>11} {par['virtual_stages']:>2} {par['dp_mode']:>12} "
              f"{par['activation_checkpointing']:>5} {q['step_time_s']:>10.4g} {q['tokens_per_s']:>10.4g} "
              f"{q['mfu']:>6.1%} {memory.fmt_bytes(r['memory_bytes']):>10}")
    if a.out:
        from scalestudy.io import write_text

        write_text(a.out, study_yaml(model.get("name", "model"), model, best, hw))
        print(f"-> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
