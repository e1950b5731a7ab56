"""Run records → tidy tables: ``runs.csv`` (+ ``runs.parquet``), ``efficiency.csv``, ``summary.md``.

    python -m scalestudy.aggregate RESULTS/STUDY      (or: scalestudy aggregate RESULTS/STUDY)

Reads ``plan.tsv`` (every point × repeat, feasible or not), each ``runs/<id>/{point,summary,
status}.json`` + ``steps.jsonl``, and optionally ``calibration.json`` and ``study.json``.
One row per planned run, failed and infeasible ones included: a run dir without
``status.json`` is ``not_run``; an infeasible plan row is ``infeasible`` with the planner's
reason. Step times are the steady-state window (declared warm-up steps dropped); per run the
median, IQR and a bootstrap 95% CI; per (series, N) the repeats are pooled and the CI comes
from a hierarchical bootstrap (repeats, then steps). Every file is written atomically.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy import efficiency as eff
from scalestudy import flops, hardware, stats
from scalestudy.io import atomic_path, read_json, write_text

STATES = ("ok", "oom", "timeout", "crashed", "infeasible", "invalid", "not_run")

RUN_COLUMNS = [
    "study", "series", "mode", "model", "point_id", "config_hash", "repeat",
    "n", "dp", "tp", "pp", "nodes", "micro_batch", "grad_accum", "global_batch", "seq_len",
    "tokens_per_step", "tokens_per_device_step", "dp_mode", "pp_schedule",
    "activation_checkpointing", "precision", "baseline_n",
    "status", "reason",
    "step_time_median_s", "step_time_q25_s", "step_time_q75_s", "step_time_iqr_s",
    "step_time_ci_lo_s", "step_time_ci_hi_s", "n_steady_steps",
    "tokens_per_s", "tokens_per_s_per_device",
    "flops_convention", "model_flops_per_step", "hardware_flops_per_step",
    "model_tflops_per_device", "hardware_tflops_per_device",
    "device_type", "device_name", "hardware", "peak_tflops", "peak_source", "mfu", "hfu",
    "measured_ceiling_tflops", "util_vs_measured_ceiling",
    "peak_memory_gb", "memory_kind", "mem_estimate_gb", "loss_first", "loss_last",
    "n_params", "exit_code", "wall_s",
]

EFFICIENCY_COLUMNS = [
    "series", "mode", "model", "n", "dp", "tp", "pp", "global_batch", "tokens_per_step",
    "baseline_n", "n_repeats", "n_ok", "step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s",
    "tokens_per_s_per_device", "tokens_per_s_per_device_ci_lo", "tokens_per_s_per_device_ci_hi",
    "efficiency", "efficiency_ci_lo", "efficiency_ci_hi",
    "speedup", "speedup_ci_lo", "speedup_ci_hi", "ideal_speedup",
    "mfu", "hfu", "util_vs_measured_ceiling", "status", "reason", "note",
]


def _read_json(path: Path) -> dict | None:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def read_steps(path: Path) -> list[dict]:
    """Lines of ``steps.jsonl``; a torn or corrupt line is skipped."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def steady_times(steps: list[dict], detect: bool = False) -> np.ndarray:
    """Steady-state step times (s): steps flagged ``warmup`` dropped (+ optional detection)."""
    times = [s.get("step_time_s", np.nan) for s in steps if not s.get("warmup", False)]
    return stats.steady_state(times, 0, detect=detect)


def _num(x) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return float("nan")
    return v


def _flops_from_point(point: dict | None, key: str, convention: str) -> float:
    """Model/hardware FLOPs per step from the resolved point (when no summary exists)."""
    if not point or convention not in flops.CONVENTIONS:
        return float("nan")
    from scalestudy.model_config import GPTConfig

    try:
        cfg = GPTConfig.from_dict(point["model"])
        rows = int(point["global_batch"])
        if key == "model":
            return flops.model_flops_per_step(cfg, rows, convention)
        ac = point.get("parallel", {}).get("activation_checkpointing", "none")
        return flops.hardware_flops_per_step(cfg, rows, convention, ac)
    except (KeyError, TypeError, ValueError):
        return float("nan")


def _seed(key: str) -> int:
    """A fixed bootstrap seed per point: distributions of different points are independent
    (the efficiency CI divides them) and every rerun gives the same table."""
    return stats.SEED + zlib.crc32(key.encode())


def run_row(plan_row: dict, run_dir: Path, calibration: dict | None, convention: str,
            detect_warmup: bool = False) -> tuple[dict, list[float], np.ndarray]:
    """One tidy row of ``runs.csv``, the run's steady-state step times (s) and the bootstrap
    distribution of their median."""
    row = {k: plan_row.get(k) for k in RUN_COLUMNS if k in plan_row}
    point = _read_json(run_dir / "point.json")
    summary = _read_json(run_dir / "summary.json") or {}
    status = _read_json(run_dir / "status.json")
    feasible = str(plan_row.get("feasible", "True")).lower() in ("true", "1", "yes")
    conv = (point or {}).get("flops_convention") or convention
    row["flops_convention"] = conv

    times: list[float] = []
    if not feasible:
        state, reason = "infeasible", plan_row.get("reason") or "infeasible"
    elif status is None:
        state, reason = "not_run", "no status.json (not run yet)"
    else:
        state = status.get("state", "invalid")
        reason = status.get("reason", "") or ""
        row["exit_code"] = status.get("exit_code")
        row["wall_s"] = status.get("wall_s")
        if state not in STATES:
            state, reason = "invalid", f"unknown state {state!r} in status.json"
    if state == "ok":
        times = steady_times(read_steps(run_dir / "steps.jsonl"), detect_warmup).tolist()
        if not times:
            state, reason = "invalid", "status ok but no steady-state steps in steps.jsonl"
    row["status"], row["reason"] = state, reason

    dist = stats.bootstrap_medians(times, seed=_seed(str(plan_row.get("point_id"))))
    lo, hi = stats.percentile_ci(dist)
    q25, q75 = stats.iqr(times)
    t, n = (float(np.median(times)) if times else float("nan")), _num(plan_row.get("n"))
    row.update(step_time_median_s=t, step_time_q25_s=q25, step_time_q75_s=q75,
               step_time_iqr_s=q75 - q25, step_time_ci_lo_s=lo, step_time_ci_hi_s=hi,
               n_steady_steps=len(times))
    tokens = _num(plan_row.get("tokens_per_step"))
    row["tokens_per_s"] = tokens / t
    row["tokens_per_s_per_device"] = tokens / t / n

    mf = _num((summary.get("model_flops_per_step") or {}).get(conv))
    hf = _num((summary.get("hardware_flops_per_step") or {}).get(conv))
    if not np.isfinite(mf):
        mf = _flops_from_point(point, "model", conv)
    if not np.isfinite(hf):
        hf = _flops_from_point(point, "hardware", conv)
    row["model_flops_per_step"], row["hardware_flops_per_step"] = mf, hf
    row["model_tflops_per_device"] = mf / t / n / 1e12
    row["hardware_tflops_per_device"] = hf / t / n / 1e12

    precision = plan_row.get("precision") or summary.get("dtype")
    peak, source, key = summary.get("peak_flops_per_device"), summary.get("peak_source"), summary.get("hardware")
    if not summary and point and point.get("platform", {}).get("hardware") and precision:
        key, peak, source = hardware.resolve_peak(point["platform"]["hardware"], precision)
    peak = _num(peak)
    row.update(device_type=summary.get("device_type") or (point or {}).get("platform", {}).get("device"),
               device_name=summary.get("device_name"), hardware=key,
               peak_tflops=peak / 1e12, peak_source=source)
    row["mfu"] = mf / (t * n * peak)
    row["hfu"] = hf / (t * n * peak)

    ceiling = float("nan")
    if calibration and calibration.get("dtype") == precision and (
            row["device_type"] in (None, calibration.get("device_type"))):
        ceiling = _num(calibration.get("flops_per_s"))
    row["measured_ceiling_tflops"] = ceiling / 1e12
    row["util_vs_measured_ceiling"] = mf / (t * n * ceiling)

    mem = _num(summary.get("peak_memory_bytes"))
    row.update(peak_memory_gb=mem / 1e9, memory_kind=summary.get("memory_kind"),
               loss_first=summary.get("loss_first"), loss_last=summary.get("loss_last"),
               n_params=summary.get("n_params"))
    return row, times, dist


def _named_baselines(study: dict | None) -> dict[str, int]:
    out = {}
    for s in (study or {}).get("series", []) or []:
        if isinstance(s, dict) and s.get("baseline") is not None:
            out[s["name"]] = int(s["baseline"])
    return out


def _series_status(states: list[str]) -> str:
    if "ok" in states:
        return "ok"
    for s in ("oom", "timeout", "crashed", "invalid", "infeasible", "not_run"):
        if s in states:
            return s
    return states[0] if states else "not_run"


def efficiency_rows(runs: pd.DataFrame, times: dict[str, list[float]],
                    study: dict | None = None,
                    dists: dict[str, np.ndarray] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """``efficiency.csv`` rows (per series and N) and the messages for series without a curve.
    ``times``: steady-state step times per point_id; ``dists``: their bootstrap distributions
    (reused when a point has a single successful repeat)."""
    named = _named_baselines(study)
    cols = ["series", "mode", "model", "n", "dp", "tp", "pp", "global_batch", "tokens_per_step",
            "baseline_n", "point_id", "status", "reason", "mfu", "hfu", "util_vs_measured_ceiling"]
    by_series: dict[str, dict[int, list[dict]]] = {}
    for rec in runs[cols].to_dict("records"):
        by_series.setdefault(rec["series"], {}).setdefault(int(rec["n"]), []).append(rec)
    rows, messages = [], []
    for series, per_n_recs in by_series.items():
        mode = str(next(iter(per_n_recs.values()))[0]["mode"])
        per_n, boot = [], {}
        for n in sorted(per_n_recs):
            recs = per_n_recs[n]
            ok = [r for r in recs if r["status"] == "ok" and times.get(r["point_id"])]
            groups = [times[r["point_id"]] for r in ok]
            if len(ok) == 1 and dists is not None and ok[0]["point_id"] in dists:
                boot[n] = dists[ok[0]["point_id"]]
            else:  # hierarchical over repeats
                boot[n] = stats.bootstrap_medians(groups, seed=_seed(f"{series}|{n}"))
            lo, hi = stats.percentile_ci(boot[n])
            pooled = {"median": float(np.median(np.concatenate(groups))) if groups else np.nan,
                      "ci_lo": lo, "ci_hi": hi}
            first = recs[0]

            def med(col):
                v = [r[col] for r in ok if pd.notna(r[col])]
                return float(np.median(v)) if v else np.nan

            per_n.append({
                "series": series, "mode": mode, "model": first["model"], "n": n,
                "dp": first["dp"], "tp": first["tp"], "pp": first["pp"],
                "global_batch": first["global_batch"], "tokens_per_step": first["tokens_per_step"],
                "n_repeats": len(recs), "n_ok": len(groups),
                "step_time_s": pooled["median"], "step_time_ci_lo_s": pooled["ci_lo"],
                "step_time_ci_hi_s": pooled["ci_hi"],
                "mfu": med("mfu"), "hfu": med("hfu"),
                "util_vs_measured_ceiling": med("util_vs_measured_ceiling"),
                "status": _series_status([r["status"] for r in recs]),
                "reason": "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in recs
                                            if r["status"] != "ok" and r["reason"]})),
                "point_id": f"{series} N={n}",
            })
        ns = [r["n"] for r in per_n]
        base = named.get(series) or next((b for k, b in named.items() if series.startswith(k + "-")), None)
        planned = [r["baseline_n"] for recs in per_n_recs.values() for r in recs if pd.notna(r["baseline_n"])]
        statuses = [r["status"] for r in per_n]
        note = ""
        if base is None and planned:
            base = int(planned[0])
            if not any(n == base and st == "ok" for n, st in zip(ns, statuses)):
                note = f"planned baseline N0={base} did not run successfully; baseline = smallest N that did"
                base = None
        tok = [r["tokens_per_step"] for r in per_n]
        problem = eff.invariant_problem(series, mode, ns, tok, [r["point_id"] for r in per_n])
        cols, cnote = eff.curve(ns, tok, [r["step_time_s"] for r in per_n], statuses, base,
                                boot=None if problem else boot)
        if problem:
            messages.append(f"series {series!r} ({mode}): no efficiency curve: {problem}")
            for c in ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup",
                      "speedup_ci_lo", "speedup_ci_hi"):
                cols[c] = np.full(len(ns), np.nan)
            text = f"invariant broken: {problem}"
        else:
            text = "; ".join(x for x in (note, cnote) if x)
            if not np.isfinite(cols["efficiency"]).any():
                messages.append(f"series {series!r} ({mode}): no efficiency curve: {text}")
        for i, r in enumerate(per_n):
            r.pop("point_id")
            for c in ("baseline_n", "step_time_s", "tokens_per_s_per_device", "efficiency",
                      "efficiency_ci_lo", "efficiency_ci_hi", "speedup", "speedup_ci_lo",
                      "speedup_ci_hi", "ideal_speedup"):
                r[c] = cols[c][i]
            r["note"] = text
            # a longer step means fewer tokens/s: the CI bounds swap
            r["tokens_per_s_per_device_ci_lo"] = r["tokens_per_step"] / (r["step_time_ci_hi_s"] * r["n"])
            r["tokens_per_s_per_device_ci_hi"] = r["tokens_per_step"] / (r["step_time_ci_lo_s"] * r["n"])
            rows.append(r)
    return pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS), messages


def _write_csv(path: Path, df: pd.DataFrame) -> None:
    write_text(path, df.to_csv(index=False, float_format="%.6g"))


def load_plan(study_dir: Path) -> pd.DataFrame:
    path = study_dir / "plan.tsv"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `scalestudy plan STUDY --write` first")
    return pd.read_csv(path, sep="\t", keep_default_na=False, na_values=[""])


def collect(study_dir: Path, detect_warmup: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``(runs, efficiency, context)`` for a study directory, without writing anything."""
    study_dir = Path(study_dir)
    plan = load_plan(study_dir)
    study = _read_json(study_dir / "study.json")
    calibration = _read_json(study_dir / "calibration.json")
    convention = (study or {}).get("flops_convention", "megatron")
    rows, times, dists = [], {}, {}
    for rec in plan.to_dict("records"):
        row, t, dist = run_row(rec, study_dir / "runs" / str(rec["point_id"]), calibration,
                               convention, detect_warmup)
        rows.append(row)
        times[str(rec["point_id"])], dists[str(rec["point_id"])] = t, dist
    runs = pd.DataFrame(rows)
    runs["study"] = (study or {}).get("name") or study_dir.name
    for c in RUN_COLUMNS:
        if c not in runs.columns:
            runs[c] = np.nan
    runs = runs[RUN_COLUMNS]
    efficiency, messages = efficiency_rows(runs, times, study, dists)
    context = {"study": study, "calibration": calibration, "messages": messages,
               "convention": convention}
    return runs, efficiency, context


def run(study_dir: Path, detect_warmup: bool = False) -> None:
    """Write ``runs.csv``, ``runs.parquet``, ``efficiency.csv`` and ``summary.md`` (atomically)."""
    from scalestudy import report

    study_dir = Path(study_dir)
    runs, efficiency, context = collect(study_dir, detect_warmup)
    _write_csv(study_dir / "runs.csv", runs)
    with atomic_path(study_dir / "runs.parquet") as tmp:
        try:
            runs.to_parquet(tmp, index=False)
        except (TypeError, ValueError, ImportError):  # mixed-type object column: store as text
            obj = runs.select_dtypes(include="object").columns
            runs.astype({c: "string" for c in obj}).to_parquet(tmp, index=False)
    _write_csv(study_dir / "efficiency.csv", efficiency)
    write_text(study_dir / "summary.md", report.summary_markdown(runs, efficiency, context))
    for msg in context["messages"]:
        print(msg, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m scalestudy.aggregate", description=__doc__.split("\n\n")[0])
    p.add_argument("study_dir", type=Path)
    p.add_argument("--detect-warmup", action="store_true",
                   help="also drop a slow start the declared warm-up missed")
    args = p.parse_args(argv)
    run(args.study_dir, args.detect_warmup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
