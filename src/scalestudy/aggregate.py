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
    "tokens_per_s_per_device", "efficiency", "efficiency_ci_lo", "efficiency_ci_hi",
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
    from scalestudy.model import GPTConfig

    try:
        cfg = GPTConfig.from_dict(point["model"])
        rows = int(point["global_batch"])
        if key == "model":
            return flops.model_flops_per_step(cfg, rows, convention)
        ac = point.get("parallel", {}).get("activation_checkpointing", "none")
        return flops.hardware_flops_per_step(cfg, rows, convention, ac)
    except (KeyError, TypeError, ValueError):
        return float("nan")


def run_row(plan_row: dict, run_dir: Path, calibration: dict | None, convention: str,
            detect_warmup: bool = False) -> tuple[dict, list[float]]:
    """One tidy row of ``runs.csv`` and the run's steady-state step times."""
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

    rep = _num(plan_row.get("repeat"))
    s = stats.summarize(times, seed=stats.SEED + (int(rep) if np.isfinite(rep) else 0))
    t, n = s["median"], _num(plan_row.get("n"))
    row.update(step_time_median_s=t, step_time_q25_s=s["q25"], step_time_q75_s=s["q75"],
               step_time_iqr_s=s["iqr"], step_time_ci_lo_s=s["ci_lo"], step_time_ci_hi_s=s["ci_hi"],
               n_steady_steps=s["n_steps"])
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
    return row, times


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
                    study: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """``efficiency.csv`` rows (per series and N) and the messages for series without a curve."""
    named = _named_baselines(study)
    frames, messages = [], []
    for series, g in runs.groupby("series", sort=False):
        mode = str(g["mode"].iloc[0])
        per_n = []
        boot: dict[int, np.ndarray] = {}
        for n, gn in g.groupby("n", sort=True):
            ok = gn[gn["status"] == "ok"]
            groups = [times[p] for p in ok["point_id"] if times.get(p)]
            pooled = stats.summarize(groups, seed=stats.SEED + int(n))
            boot[int(n)] = stats.bootstrap_medians(groups, seed=stats.SEED + int(n))
            first = gn.iloc[0]
            bad = gn[gn["status"] != "ok"]
            per_n.append({
                "series": series, "mode": mode, "model": first.get("model"), "n": int(n),
                "dp": first.get("dp"), "tp": first.get("tp"), "pp": first.get("pp"),
                "global_batch": first.get("global_batch"), "tokens_per_step": first["tokens_per_step"],
                "n_repeats": len(gn), "n_ok": len(groups),
                "step_time_s": pooled["median"], "step_time_ci_lo_s": pooled["ci_lo"],
                "step_time_ci_hi_s": pooled["ci_hi"],
                "mfu": ok["mfu"].median() if len(ok) else np.nan,
                "hfu": ok["hfu"].median() if len(ok) else np.nan,
                "util_vs_measured_ceiling": ok["util_vs_measured_ceiling"].median() if len(ok) else np.nan,
                "status": _series_status(gn["status"].tolist()),
                "reason": "; ".join(sorted({f"{r.status}: {r.reason}" for r in bad.itertuples() if r.reason})),
                "_point_id": f"{series} N={int(n)}",
            })
        d = pd.DataFrame(per_n)
        base = named.get(series) or next((b for k, b in named.items() if series.startswith(k + "-")), None)
        planned = pd.to_numeric(g["baseline_n"], errors="coerce").dropna()
        note = ""
        if base is None and len(planned):
            base = int(planned.iloc[0])
            if not ((d["n"] == base) & (d["status"] == "ok")).any():
                note = f"planned baseline N0={base} did not run successfully; baseline = smallest N that did"
                base = None
        try:
            e = eff.efficiency_table(d.assign(point_id=d["_point_id"]), mode, base, boot=boot)
        except eff.InvariantError as err:
            msg = f"series {series!r} ({mode}): no efficiency curve: {err}"
            messages.append(msg)
            e = eff.efficiency_table(d, mode, base, boot=None, check=False)
            for c in ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup",
                      "speedup_ci_lo", "speedup_ci_hi"):
                e[c] = np.nan
            e["note"] = f"invariant broken: {err}"
        else:
            if note or e["note"].iloc[0]:
                e["note"] = "; ".join(x for x in (note, e["note"].iloc[0]) if x)
            if e["efficiency"].isna().all():
                messages.append(f"series {series!r} ({mode}): no efficiency curve: {e['note'].iloc[0]}")
        d = d.drop(columns=["_point_id"])
        merged = d.drop(columns=["status", "step_time_s"]).merge(
            e[["n", "baseline_n", "step_time_s", "tokens_per_s_per_device", "efficiency",
               "efficiency_ci_lo", "efficiency_ci_hi", "speedup", "speedup_ci_lo",
               "speedup_ci_hi", "ideal_speedup", "status", "note"]], on="n")
        frames.append(merged)
    if not frames:
        return pd.DataFrame(columns=EFFICIENCY_COLUMNS), messages
    out = pd.concat(frames, ignore_index=True)
    return out[EFFICIENCY_COLUMNS], messages


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
    rows, times = [], {}
    for rec in plan.to_dict("records"):
        row, t = run_row(rec, study_dir / "runs" / str(rec["point_id"]), calibration, convention,
                         detect_warmup)
        rows.append(row)
        times[str(rec["point_id"])] = t
    runs = pd.DataFrame(rows)
    runs["study"] = (study or {}).get("name") or study_dir.name
    for c in RUN_COLUMNS:
        if c not in runs.columns:
            runs[c] = np.nan
    runs = runs[RUN_COLUMNS]
    efficiency, messages = efficiency_rows(runs, times, study)
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
        runs.to_parquet(tmp, index=False)
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
