"""Expand a validated study into sweep points: weak/strong batch derivation, parallelism
constraints, memory feasibility, point ids.

Weak scaling keeps tokens per device per step fixed: TP×PP fixed, DP = N/(TP·PP) grows,
micro-batch and accumulation fixed, global batch = micro_batch · grad_accum · DP.
Strong scaling keeps tokens per step fixed: global batch fixed, accumulation =
global_batch / (micro_batch · DP) shrinks as DP grows.

A point is a plain dict in the ``point.json`` format of ``docs/architecture.md``; infeasible
points carry ``feasible=False`` and a ``reason`` with the numbers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

from scalestudy.memory import ffn_width
from scalestudy.study import StudyError

SWEEPABLE = ("tp", "pp", "micro_batch", "dp_mode", "pp_schedule", "activation_checkpointing")
PLAN_COLUMNS = [
    "point_id", "config_hash", "series", "mode", "model", "n", "dp", "tp", "pp", "nodes",
    "procs_per_node", "micro_batch", "grad_accum", "global_batch", "seq_len", "tokens_per_step",
    "tokens_per_device_step", "dp_mode", "pp_schedule", "virtual_stages",
    "activation_checkpointing", "precision", "repeat", "baseline_n", "feasible", "reason",
    "mem_estimate_gb",
]
# settings that do not change what is measured: changing them must not rerun a point
_UNHASHED_PLATFORM = ("timeout_s", "collective_timeout_s", "site", "max_nodes",
                      "memory_limit_mb")


def expand_series(series: dict) -> list[dict]:
    """A series whose sweepable axes hold lists -> one concrete series per combination, named
    ``<name>-<axis><value>...`` for the list-valued axes only."""
    axes = [a for a in SWEEPABLE if isinstance(series.get(a), list)]
    if not axes:
        return [dict(series)]
    out = []
    for combo in itertools.product(*(series[a] for a in axes)):
        s = dict(series, **dict(zip(axes, combo)))
        short = {"micro_batch": "mb", "activation_checkpointing": "ac", "pp_schedule": "",
                 "dp_mode": ""}
        s["name"] = series["name"] + "".join(f"-{short.get(a, a)}{v}" for a, v in zip(axes, combo))
        s["sweep_parent"] = series["name"]
        out.append(s)
    return out


def config_hash(point: dict) -> str:
    """8 hex digits over everything that changes the measurement (not names, repeat, timeouts)."""
    keep = {k: v for k, v in point.items()
            if k not in ("study", "series", "point_id", "config_hash", "repeat", "baseline_n",
                         "feasible", "reason", "mem_estimate_gb", "sweep_parent",
                         "flops_convention", "references", "retries")}
    keep["platform"] = {k: v for k, v in point["platform"].items() if k not in _UNHASHED_PLATFORM}
    blob = json.dumps(keep, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:8]


def _fmt(x) -> str:
    return str(int(x)) if float(x).is_integer() else "x"


def _derive(series: dict, n: int) -> dict:
    """Batch and parallel shape of one point (values may be fractional when infeasible)."""
    tp, pp, mb = series["tp"], series["pp"], series["micro_batch"]
    dp = n / (tp * pp)
    if series["mode"] == "weak":
        ga = series["grad_accum"]
        gb = mb * ga * dp
    else:
        gb = series["global_batch"]
        ga = gb / (mb * dp)
    return {"dp": dp, "grad_accum": ga, "global_batch": gb}


def constraint_violation(p: dict, model: dict, platform: dict) -> str | None:
    """The first constraint the point breaks, as a sentence with the numbers; None if fine."""
    n, tp, pp, dp = p["n"], p["tp"], p["pp"], p["dp"]
    mb, ga, gb = p["micro_batch"], p["grad_accum"], p["global_batch"]
    par = p["parallel"]
    v = par["virtual_stages"]
    if n % (tp * pp):
        return f"N={n} is not divisible by tp*pp={tp * pp}"
    if tp > platform["devices_per_node"]:
        return (f"tp={tp} exceeds devices_per_node={platform['devices_per_node']} "
                "(tensor parallelism stays inside a node)")
    ffn = ffn_width(model)
    for what, size in (("heads", model["heads"]), ("hidden", model["hidden"]), ("ffn", ffn),
                       ("vocab", model["vocab"])):
        if size % tp:
            return f"tp={tp} does not divide {what}={size}"
    if par["sequence_parallel"] and model["seq_len"] % tp:
        return f"sequence_parallel needs tp={tp} to divide seq_len={model['seq_len']}"
    if v > 1 and pp == 1:
        return f"virtual_stages={v} needs pp > 1"
    if model["layers"] % (pp * v):
        return (f"layers={model['layers']} do not split into pp*virtual_stages={pp * v} "
                "equal stages")
    if p["mode"] == "strong":
        if gb < mb * dp:
            return (f"global_batch={gb} is smaller than micro_batch*dp={mb}*{int(dp)}"
                    f"={int(mb * dp)}: some data-parallel rank would get no data")
        if gb % (mb * dp):
            return (f"global_batch={gb} is not divisible by micro_batch*dp={mb}*{int(dp)}"
                    f"={int(mb * dp)}")
    if par["pp_schedule"] == "interleaved1f1b" and v < 2 and pp > 1:
        return "pp_schedule=interleaved1f1b needs virtual_stages >= 2 (use 1f1b for one stage per rank)"
    if par["pp_schedule"] != "interleaved1f1b" and v > 1:
        return f"virtual_stages={v} needs pp_schedule=interleaved1f1b"
    if par["dp_mode"] == "zero1" and dp > 1 and tp > 1 and model["tied_embeddings"]:
        return ("dp_mode=zero1 with tp>1 needs tied_embeddings=false (use fsdp_grad_op for a "
                "tied model)")
    if pp > 1:
        if model["tied_embeddings"]:
            return "pp>1 needs tied_embeddings=false (first and last stage would share a weight)"
        if par["pp_schedule"] != "gpipe" and ga < pp:
            return (f"pp_schedule={par['pp_schedule']} needs at least pp={pp} micro-batches per "
                    f"step, got grad_accum={int(ga)}")
        if par["pp_schedule"] == "interleaved1f1b" and ga % pp:
            return (f"pp_schedule=interleaved1f1b needs micro-batches (grad_accum={int(ga)}) to "
                    f"be a multiple of pp={pp}")
    if n > platform["devices_per_node"]:
        if n % platform["devices_per_node"]:
            return (f"N={n} does not fill whole nodes of devices_per_node="
                    f"{platform['devices_per_node']}")
        nodes = n // platform["devices_per_node"]
        if nodes > platform["max_nodes"]:
            return f"needs {nodes} nodes, platform.max_nodes={platform['max_nodes']}"
    return None


def _memory_check(point: dict, capacity_gb: float | None) -> tuple[float, str | None]:
    """(estimated GB per device, reason if it does not fit in 90% of the capacity)."""
    from scalestudy import memory

    gb = memory.estimate(point)["total_bytes"] / 1e9
    if capacity_gb is None:
        return gb, None
    ok, reason = memory.fits(point, capacity_gb * 1e9, headroom=0.9)
    return gb, None if ok else reason


def memory_capacity_gb(platform: dict) -> float | None:
    """Per-device memory for the feasibility check: declared, or the peaks table's, or None."""
    if platform.get("memory_per_device_gb"):
        return float(platform["memory_per_device_gb"])
    if platform.get("hardware"):
        from scalestudy import hardware

        peaks = hardware.load_peaks().set_index("device")
        if platform["hardware"] in peaks.index:
            return float(peaks.loc[platform["hardware"], "memory_gb"])
    return None


def plan_points(study: dict) -> list[dict]:
    """Every (point, repeat) of a validated study, feasible or not, in study order."""
    platform = study["platform"]
    capacity = memory_capacity_gb(platform)
    points: list[dict] = []
    seen: dict[tuple, str] = {}
    for raw in study["series"]:
        for s in expand_series(raw):
            model = dict(study["models"][s["model"]], name=s["model"])
            series_points = []
            for n in s["gpus"]:
                d = _derive(s, n)
                parallel = {k: s.get(k, study["parallel"][k]) for k in study["parallel"]}
                p = {
                    "study": study["name"], "series": s["name"], "mode": s["mode"],
                    "n": n, "dp": d["dp"], "tp": s["tp"], "pp": s["pp"],
                    "micro_batch": s["micro_batch"], "grad_accum": d["grad_accum"],
                    "global_batch": d["global_batch"], "seq_len": model["seq_len"],
                    "model": model, "parallel": parallel, "train": dict(study["train"]),
                    "platform": dict(platform), "flops_convention": study["flops_convention"],
                    "references": list(study["references"]),
                    "retries": study["retries"],
                }
                reason = constraint_violation(p, model, platform)
                nodes = max(1, -(-n // platform["devices_per_node"]))
                p.update(nodes=nodes, procs_per_node=-(-n // nodes))
                for k in ("dp", "grad_accum", "global_batch"):
                    p[k] = int(p[k]) if float(p[k]).is_integer() else p[k]
                p["tokens_per_step"] = p["global_batch"] * model["seq_len"]
                p["tokens_per_device_step"] = p["tokens_per_step"] / n
                mem = None
                if reason is None:
                    mem, reason = _memory_check(p, capacity)
                p.update(feasible=reason is None, reason=reason or "", mem_estimate_gb=mem)
                p["config_hash"] = config_hash(p)
                key = (s["mode"], p["config_hash"])
                if key in seen:
                    raise StudyError(
                        f"series {s['name']!r}.gpus: point N={n} duplicates series "
                        f"{seen[key]!r} (same mode and resolved config); remove N={n} from one "
                        "of them or change a setting")
                seen[key] = s["name"]
                series_points.append(p)
            feasible_n = [p["n"] for p in series_points if p["feasible"]]
            baseline = s.get("baseline") or (min(feasible_n) if feasible_n else min(s["gpus"]))
            for p in series_points:
                p["baseline_n"] = baseline
                for r in range(study["repeats"]):
                    q = dict(p, repeat=r)
                    q["point_id"] = (
                        f"{s['name']}_n{q['n']}_dp{_fmt(q['dp'])}-tp{q['tp']}-pp{q['pp']}"
                        f"_mb{q['micro_batch']}-ga{_fmt(q['grad_accum'])}"
                        f"-gb{_fmt(q['global_batch'])}_{q['config_hash']}_r{r}")
                    points.append(q)
    if not any(p["feasible"] for p in points):
        first = points[0]
        raise StudyError(f"series {first['series']!r}: no feasible point in the study (N="
                         f"{first['n']}: {first['reason']}); change the series' gpus, tp, pp, "
                         "micro_batch or global_batch so that at least one point fits")
    return points


def plan_rows(points: list[dict]) -> list[dict]:
    """Flat rows of ``plan.tsv`` (see ``PLAN_COLUMNS``)."""
    rows = []
    for p in points:
        row = {k: p.get(k) for k in PLAN_COLUMNS}
        row["model"] = p["model"]["name"]
        row.update({k: p["parallel"][k] for k in ("dp_mode", "pp_schedule", "virtual_stages",
                                                  "activation_checkpointing")})
        row["precision"] = p["train"]["precision"]
        if row["mem_estimate_gb"] is not None:
            row["mem_estimate_gb"] = round(row["mem_estimate_gb"], 4)
        rows.append(row)
    return rows


def plan_table(points: list[dict]) -> str:
    """``plan.tsv`` text: tab-separated, header first; no tabs or newlines inside fields."""
    lines = ["\t".join(PLAN_COLUMNS)]
    for row in plan_rows(points):
        cells = ["" if row[k] is None else str(row[k]) for k in PLAN_COLUMNS]
        lines.append("\t".join(c.replace("\t", " ").replace("\n", " ") for c in cells))
    return "\n".join(lines) + "\n"


def write_plan(points: list[dict], study_dir: Path) -> Path:
    from scalestudy.io import write_text

    return write_text(Path(study_dir) / "plan.tsv", plan_table(points))
