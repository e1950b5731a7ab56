"""Run records → tidy tables: the rows of ``runs.csv`` (+ ``runs.parquet``) and
``efficiency.csv`` (``scalestudy.report.summary`` writes them, with ``summary.md`` and
``summary.tex``: ``scalestudy aggregate RESULTS/STUDY``).

Reads ``plan.tsv`` (every point × repeat, feasible or not), each ``runs/<id>/{summary,
status}.json`` + ``steps.jsonl`` (``point.json`` only for a run without ``summary.json``), and
optionally ``calibration.json`` and ``study.json`` (whose FLOPs convention applies to every row).
One row per planned run, failed and infeasible ones included: a run dir without
``status.json`` is ``not_run``; an infeasible plan row is ``infeasible`` with the planner's
reason. Step times are the steady-state window (declared warm-up steps dropped); per run the
median, IQR and a bootstrap 95% CI; per (series, N) the repeats are pooled and the CI comes
from a hierarchical bootstrap (repeats, then steps).

Runs are read one by one into plain lists; their statistics are computed in batches of runs
with equal step counts (``stats.*_rows``) and the tables are built once at the end.
"""

from __future__ import annotations

import math
import os
import zlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from scalestudy.number_format import finite_or_nan
from scalestudy.analysis import efficiency as eff
from scalestudy.analysis import stats
from scalestudy.config.point import Point
from scalestudy.config.checks import PointError
from scalestudy.config.vocab import FlopsConvention
from scalestudy.config import devices, flops
from scalestudy.record import run_records as rread
from scalestudy.record.bounded_read import RecordError, read_text
from scalestudy.record import stragglers
from scalestudy.record.states import RunState

RUN_COLUMNS = [
    "study", "series", "mode", "model", "point_id", "config_hash", "repeat",
    "n", "dp", "tp", "pp", "cp", "nodes", "micro_batch", "grad_accum", "global_batch", "seq_len",
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
    "peak_memory_gb", "memory_kind", "memory_note", "mem_estimate_gb", "loss_first", "loss_last",
    "n_params", "exit_code", "wall_s", "workload",
    # energy (train/energy.py): empty where no counter was readable, energy_note says why
    "joules_per_token", "avg_power_w", "energy_source", "energy_note",
    # stragglers (record/stragglers.py): empty without per-rank times (one rank, a command)
    *stragglers.RUNS_COLUMNS,
]

EFFICIENCY_COLUMNS = [
    "series", "mode", "model", "n", "dp", "tp", "pp", "cp", "global_batch", "tokens_per_step",
    "baseline_n", "n_repeats", "n_ok", "step_time_s", "step_time_ci_lo_s", "step_time_ci_hi_s",
    "tokens_per_s_per_device", "tokens_per_s_per_device_ci_lo", "tokens_per_s_per_device_ci_hi",
    "efficiency", "efficiency_ci_lo", "efficiency_ci_hi",
    "speedup", "speedup_ci_lo", "speedup_ci_hi", "ideal_speedup",
    "mfu", "hfu", "util_vs_measured_ceiling", "status", "reason", "note",
]


def steady_times(steps: rread.Steps | None, detect: bool = False) -> np.ndarray:
    """Steady-state step times (s): steps flagged ``warmup`` dropped (+ optional detection)."""
    return stats.steady_state(steps.steady() if steps else [], 0, detect=detect)


def _flops_from_point(point: dict | None, key: str, convention: str) -> float:
    """Model/hardware FLOPs per step from a ``point.json`` object (when no summary exists),
    as its workload knows them (``flops.point_flops_table``); NaN when it is not a readable
    point or the FLOPs are unknown."""
    try:
        p = Point.from_json(point or {})
        value = flops.point_flops_table(p)[key].get(str(convention))
    except (PointError, ValueError, TypeError, KeyError, AttributeError):
        return float("nan")  # (a point.json the reader let through but Point cannot rebuild)
    return float("nan") if value is None or not value > 0 else float(value)


def _seed(key: str) -> int:
    """A fixed bootstrap seed per point: distributions of different points are independent
    (the efficiency CI divides them) and every rerun gives the same table."""
    return stats.SEED + zlib.crc32(key.encode())


# the columns computed from the median step time t (s) and the run's constants
_STEP_COLUMNS = ("step_time_median_s", "step_time_q25_s", "step_time_q75_s", "step_time_iqr_s",
                 "step_time_ci_lo_s", "step_time_ci_hi_s", "n_steady_steps", "tokens_per_s",
                 "tokens_per_s_per_device", "model_tflops_per_device",
                 "hardware_tflops_per_device", "mfu", "hfu", "util_vs_measured_ceiling")
# per run, for those columns: tokens per step, N, model and hardware FLOPs per step,
# spec peak and measured ceiling (FLOP/s per device)
_CONSTANTS = ("tokens", "n", "model_flops", "hardware_flops", "peak", "ceiling")


def _read_records(run_dir: str | None, pid: str, chash: str | None
                  ) -> tuple[dict, dict, dict | None, list[str]]:
    """A run folder's ``point.json``, ``summary.json`` ({} when absent or damaged),
    ``status.json`` (None) and why any of them, or ``env.json``, cannot be used (summary and
    env checked against the point: the reader's ``*_vs_point``)."""
    damaged: list[str] = []
    point, summary, status = {}, {}, None
    if run_dir:
        point, why = rread.read_point(run_dir, pid, chash)
        damaged += [why] if why else []
        point = point or {}
        summary, why = rread.read_summary(run_dir, pid, chash, point)
        damaged += [why] if why else []
        summary = summary or {}
        status, why = rread.read_status(run_dir)
        damaged += [why] if why else []
        damaged += [w for w in [rread.read_env(run_dir, point)[1]] if w]
    return point, summary, status, damaged


def _add_rate_columns(row: dict, plan_row: dict, point: dict, summary: dict,
                      calibration: dict | None, conv: str, state: RunState) -> tuple:
    """Add a run's FLOPs per step, peak and measured ceiling (TFLOP/s per device), memory
    (GB), loss and energy columns to ``row``; return its ``_CONSTANTS``."""
    mf = finite_or_nan((summary.get("model_flops_per_step") or {}).get(conv))
    hf = finite_or_nan((summary.get("hardware_flops_per_step") or {}).get(conv))
    if not math.isfinite(mf):
        mf = _flops_from_point(point, "model", conv)
    if not math.isfinite(hf):
        hf = _flops_from_point(point, "hardware", conv)
    row["model_flops_per_step"], row["hardware_flops_per_step"] = mf, hf

    precision = plan_row.get("precision") or summary.get("dtype")
    peak, source, key = summary.get("peak_flops_per_device"), summary.get("peak_source"), summary.get("hardware")
    if not summary and point.get("platform", {}).get("hardware") and precision:
        key, peak, source = _resolve_peak(point["platform"]["hardware"], precision)
    peak = finite_or_nan(peak)
    row.update(device_type=summary.get("device_type") or point.get("platform", {}).get("device"),
               device_name=summary.get("device_name"), hardware=key,
               peak_tflops=peak / 1e12, peak_source=source)

    ceiling = float("nan")
    if calibration and calibration.get("dtype") == precision and (
            row["device_type"] in (None, calibration.get("device_type"))):
        ceiling = finite_or_nan(calibration.get("flops_per_s"))
    row["measured_ceiling_tflops"] = ceiling / 1e12

    mem = finite_or_nan(summary.get("peak_memory_bytes"))
    row.update(peak_memory_gb=mem / 1e9, memory_kind=summary.get("memory_kind"),
               memory_note=summary.get("memory_note"),
               loss_first=summary.get("loss_first"), loss_last=summary.get("loss_last"),
               n_params=summary.get("n_params"))
    row.update(energy_columns(summary) if state == RunState.OK else {})
    if state == RunState.OK:
        row.update(stragglers.columns(summary.get(stragglers.SUMMARY_KEY),
                                      stragglers.threshold(point)))
    return (finite_or_nan(plan_row.get("tokens_per_step")), finite_or_nan(plan_row.get("n")), mf, hf, peak,
                 ceiling)


def read_run(plan_row: dict, run_dir, calibration: dict | None, convention: str | None,
             detect_warmup: bool = False) -> tuple[dict, list[float], tuple]:
    """A run's row of ``runs.csv`` without the step-time columns (``_STEP_COLUMNS``), its
    steady-state step times (s) and its constants for those columns (``_CONSTANTS``).

    Reads ``status.json``, ``summary.json`` and, for an ok run, ``steps.jsonl``; ``point.json``
    only when they lack what it holds (no summary: a failed or unfinished run). ``run_dir``
    None: the run has no directory (nothing to read). ``convention`` is the study's FLOPs
    convention; None: take each point's (``point.json``)."""
    row = {k: plan_row[k] for k in RUN_COLUMNS if k in plan_row}
    run_dir = None if run_dir is None else str(run_dir)
    pid, chash = str(plan_row.get("point_id")), plan_row.get("config_hash")
    chash = chash if isinstance(chash, str) and chash else None
    point, summary, status, damaged = _read_records(run_dir, pid, chash)

    feasible = rread.feasible(plan_row)
    conv = convention or point.get("flops_convention") or FlopsConvention.MEGATRON
    row["flops_convention"] = conv

    times: list[float] = []
    if not feasible:
        state, reason = RunState.INFEASIBLE, plan_row.get("reason") or "infeasible"
    elif status is None and not damaged:
        state, reason = RunState.NOT_RUN, "no status.json (not run yet)"
    elif status is None:
        state, reason = RunState.INVALID, damaged[0]
    else:
        state, reason = RunState(status["state"]), status.get("reason") or ""
        row["exit_code"] = status.get("exit_code")
        row["wall_s"] = status.get("wall_s")
        if damaged and state == RunState.OK:
            state, reason = RunState.INVALID, damaged[0]
        elif damaged:
            summary = {}  # a failed run's damaged record adds nothing
    if state == RunState.OK:  # (status.json exists, so run_dir does)
        steps, why = rread.read_steps(run_dir + "/steps.jsonl", point=point)
        times = steady_times(steps, detect_warmup).tolist()
        if why:
            state, reason, times = RunState.INVALID, f"status ok but {why}", []
        elif not times:
            state, reason = RunState.INVALID, "status ok but no steady-state steps in steps.jsonl"
    row["status"], row["reason"] = str(state), reason

    constants = _add_rate_columns(row, plan_row, point, summary, calibration, conv, state)
    return row, times, constants


def energy_columns(summary: dict) -> dict:
    """The energy columns of an ok run from its ``summary.json`` (``energy``: see
    ``scalestudy.train.energy.summarize``); empty values with the reason when unmeasured."""
    e = summary.get("energy")
    empty = {"joules_per_token": None, "avg_power_w": None, "energy_source": None}
    if not isinstance(e, dict):
        return {**empty, "energy_note": "summary.json has no energy record (a workload that "
                                        "does not record energy)"}
    jpt, power = finite_or_nan(e.get("joules_per_token")), finite_or_nan(e.get("avg_power_w"))
    if not (math.isfinite(jpt) and e.get("source")):
        return {**empty, "energy_note": str(e.get("reason") or "no energy counter")}
    return {"joules_per_token": jpt, "avg_power_w": power, "energy_source": e.get("source"),
            "energy_note": str(e.get("note") or "")}


_resolve_peak = lru_cache(maxsize=None)(devices.resolve_peak)  # a pure lookup in a fixed table


def step_columns(times: list[list[float]], seeds: list[int], constants: np.ndarray
                 ) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    """The ``_STEP_COLUMNS`` of many runs at once, and each run's bootstrap distribution of
    its median step time (empty without steps).

    ``times``: steady-state step times (s) per run; ``seeds``: bootstrap seed per run;
    ``constants``: ``(runs, 6)`` array of ``_CONSTANTS``. Runs with equal step counts share one
    batch of ``stats.*_rows`` calls; every value equals the one-run computation."""
    k = len(times)
    cols = {c: np.full(k, np.nan) for c in _STEP_COLUMNS}
    cols["n_steady_steps"] = np.array([len(t) for t in times], dtype=np.int64)
    dists: list[np.ndarray] = [np.empty(0)] * k
    by_len: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        if t:
            by_len.setdefault(len(t), []).append(i)
    for idx in by_len.values():
        x = np.array([times[i] for i in idx], dtype=float)
        boot = stats.bootstrap_medians_rows(x, [seeds[i] for i in idx])
        med, q25, q75 = stats.median_iqr_rows(x)
        lo, hi = stats.percentile_ci_rows(boot)
        for c, v in (("step_time_median_s", med), ("step_time_q25_s", q25),
                     ("step_time_q75_s", q75), ("step_time_ci_lo_s", lo), ("step_time_ci_hi_s", hi)):
            cols[c][idx] = v
        for j, i in enumerate(idx):
            dists[i] = boot[j]
    cols["step_time_iqr_s"] = cols["step_time_q75_s"] - cols["step_time_q25_s"]
    tokens, n, mf, hf, peak, ceiling = np.asarray(constants, dtype=float).reshape(k, 6).T
    t = cols["step_time_median_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        cols["tokens_per_s"] = tokens / t
        cols["tokens_per_s_per_device"] = tokens / t / n
        cols["model_tflops_per_device"] = mf / t / n / 1e12
        cols["hardware_tflops_per_device"] = hf / t / n / 1e12
        cols["mfu"] = flops.utilisation(mf, t, n, peak)
        cols["hfu"] = flops.utilisation(hf, t, n, peak)
        cols["util_vs_measured_ceiling"] = flops.utilisation(mf, t, n, ceiling)
    return cols, dists


def _named_baselines(study: dict | None) -> dict[str, int]:
    out = {}
    for s in (study or {}).get("series", []) or []:
        if isinstance(s, dict) and s.get("baseline") is not None:
            out[s["name"]] = int(s["baseline"])
    return out


def _series_status(states: list[str]) -> str:
    """The state that speaks for several repeats: ok if any ran, else the first failure in
    ``RunState``'s order."""
    for s in RunState:
        if s in states:
            return str(s)
    return states[0] if states else str(RunState.NOT_RUN)


def _records(df: pd.DataFrame, cols: list[str]) -> list[dict]:
    """``df[cols].to_dict("records")`` (Python scalars, NaN for missing), built column-wise."""
    values = [df[c].tolist() for c in cols]
    return [dict(zip(cols, v)) for v in zip(*values)]


def _median(values: list[float]) -> float:
    """``float(np.median(values))`` of a short list of floats, in pure Python (same value)."""
    v = sorted(values)
    h = len(v) // 2
    return float(v[h]) if len(v) % 2 else (v[h - 1] + v[h]) / 2


def _n_row(series: str, mode: str, n: int, recs: list[dict], times: dict[str, list[float]],
           dists: dict[str, np.ndarray] | None, cis: dict[str, tuple[float, float]] | None
           ) -> tuple[dict, np.ndarray]:
    """One (series, N) row of ``efficiency.csv`` before its curve columns (``point_id`` a
    label, the CI NaN when not known yet) and the bootstrap distribution of its pooled median
    step time (s): the repeats' ``recs``, arguments as :func:`efficiency_rows`."""
    ok = [r for r in recs if r["status"] == "ok" and times.get(r["point_id"])]
    groups = [times[r["point_id"]] for r in ok]
    ci = None
    if len(ok) == 1 and dists is not None and ok[0]["point_id"] in dists:
        boot = dists[ok[0]["point_id"]]
        ci = (cis or {}).get(ok[0]["point_id"])
    elif groups:  # hierarchical over repeats
        boot = stats.bootstrap_medians(groups, seed=_seed(f"{series}|{n}"))
    else:
        boot = np.empty(0)
    if len(groups) == 1:
        median = _median(groups[0])
    else:
        median = float(np.median(np.concatenate(groups))) if groups else np.nan
    first = recs[0]

    def med(col):
        v = [r[col] for r in ok if pd.notna(r[col])]
        return _median(v) if v else np.nan

    return {
        "series": series, "mode": mode, "model": first["model"], "n": n,
        "dp": first["dp"], "tp": first["tp"], "pp": first["pp"], "cp": first["cp"],
        "global_batch": first["global_batch"], "tokens_per_step": first["tokens_per_step"],
        "n_repeats": len(recs), "n_ok": len(groups),
        "step_time_s": median, "step_time_ci_lo_s": ci[0] if ci else np.nan,
        "step_time_ci_hi_s": ci[1] if ci else np.nan,
        "mfu": med("mfu"), "hfu": med("hfu"),
        "util_vs_measured_ceiling": med("util_vs_measured_ceiling"),
        "status": _series_status([r["status"] for r in recs]),
        "reason": "; ".join(sorted({f"{r['status']}: {r['reason']}" for r in recs
                                    if r["status"] != "ok" and r["reason"]})),
        "point_id": f"{series} N={n}",
    }, boot


def _fill_step_time_cis(pairs: list[tuple[dict, np.ndarray]]) -> None:
    """Set the step-time CI (s) of each (row, bootstrap distribution) whose CI is not known
    yet (NaN), in batches of equal bootstrap sizes."""
    by_size: dict[int, list[tuple[dict, np.ndarray]]] = {}
    for r, b in pairs:
        if len(b) and np.isnan(r["step_time_ci_lo_s"]):  # (NaN: not known yet)
            by_size.setdefault(len(b), []).append((r, b))
    for same in by_size.values():
        for a in range(0, len(same), 256):
            chunk = same[a:a + 256]
            lo, hi = stats.percentile_ci_rows(np.array([b for _, b in chunk]))
            for (r, _), x, z in zip(chunk, lo.tolist(), hi.tolist()):
                r["step_time_ci_lo_s"], r["step_time_ci_hi_s"] = x, z


def _add_curve(series: str, mode: str, per_n_recs: dict[int, list[dict]], per_n: list[dict],
               boot: dict[int, np.ndarray], named: dict[str, int]) -> str | None:
    """Complete one series' rows (``per_n``, from :func:`_n_row`) with its efficiency and
    speedup curve; the message when the series has no curve."""
    ns = [r["n"] for r in per_n]
    base = named.get(series) or next((b for k, b in named.items() if series.startswith(k + "-")), None)
    planned = [r["baseline_n"] for recs in per_n_recs.values() for r in recs if pd.notna(r["baseline_n"])]
    statuses = [r["status"] for r in per_n]
    note, message = "", None
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
        message = f"series {series!r} ({mode}): no efficiency curve: {problem}"
        for c in ("efficiency", "efficiency_ci_lo", "efficiency_ci_hi", "speedup",
                  "speedup_ci_lo", "speedup_ci_hi"):
            cols[c] = np.full(len(ns), np.nan)
        text = f"invariant broken: {problem}"
    else:
        text = "; ".join(x for x in (note, cnote) if x)
        if not np.isfinite(cols["efficiency"]).any():
            message = f"series {series!r} ({mode}): no efficiency curve: {text}"
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
    return message


def efficiency_rows(runs: pd.DataFrame, times: dict[str, list[float]],
                    study: dict | None = None,
                    dists: dict[str, np.ndarray] | None = None,
                    cis: dict[str, tuple[float, float]] | None = None
                    ) -> tuple[pd.DataFrame, list[str]]:
    """``efficiency.csv`` rows (per series and N) and the messages for series without a curve.
    ``times``: steady-state step times per point_id; ``dists``: their bootstrap distributions
    (reused when a point has a single successful repeat); ``cis``: ``stats.percentile_ci`` of
    those distributions where already computed (s)."""
    named = _named_baselines(study)
    cols = ["series", "mode", "model", "n", "dp", "tp", "pp", "cp", "global_batch",
            "tokens_per_step", "baseline_n", "point_id", "status", "reason", "mfu", "hfu", "util_vs_measured_ceiling"]
    by_series: dict[str, dict[int, list[dict]]] = {}
    for rec in _records(runs, cols):
        by_series.setdefault(rec["series"], {}).setdefault(int(rec["n"]), []).append(rec)

    # per (series, N): the pooled median and the bootstrap distribution of the step time
    series_rows: list[tuple[str, str, dict, list[dict], dict]] = []
    for series, per_n_recs in by_series.items():
        mode = str(next(iter(per_n_recs.values()))[0]["mode"])
        per_n, boot = [], {}
        for n in sorted(per_n_recs):
            row, boot[n] = _n_row(series, mode, n, per_n_recs[n], times, dists, cis)
            per_n.append(row)
        series_rows.append((series, mode, per_n_recs, per_n, boot))

    _fill_step_time_cis([(r, boot[r["n"]]) for *_, per_n, boot in series_rows for r in per_n])

    rows, messages = [], []
    for series, mode, per_n_recs, per_n, boot in series_rows:
        message = _add_curve(series, mode, per_n_recs, per_n, boot, named)
        messages += [message] if message else []
        rows += per_n
    return pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS), messages


def load_plan(study_dir: Path) -> pd.DataFrame:
    """``plan.tsv`` checked by the one reader (``record.run_records.read_plan``: a cut, duplicated
    or damaged row is a one-line RecordError), as a table."""
    import io

    path = study_dir / "plan.tsv"
    if not study_dir.is_dir():
        raise RecordError(f"{study_dir}: no such study folder (the results of "
                                "`scalestudy run STUDY.yaml`)")
    if rread.read_plan(study_dir) is None:
        raise RecordError(f"{path} not found: run `scalestudy plan STUDY --write` first")
    return pd.read_csv(io.StringIO(read_text(path)), sep="\t", keep_default_na=False,
                       na_values=[""])


def collect(study_dir: Path, detect_warmup: bool = False) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """``(runs, efficiency, context)`` for a study directory, without writing anything."""
    study_dir = Path(study_dir)
    plan = load_plan(study_dir)
    study = rread.read_study(study_dir)
    calibration, cal_problem = rread.read_calibration(study_dir)
    convention = (study or {}).get("flops_convention", "megatron")
    runs_dir = str(study_dir / "runs")
    try:  # one listing instead of failed opens for every run without a directory
        present = set(os.listdir(runs_dir))
    except OSError:
        present = set()
    rows, times, constants, ids = [], [], [], []
    for rec in _records(plan, list(plan.columns)):
        pid = str(rec["point_id"])
        row, t, c = read_run(rec, os.path.join(runs_dir, pid) if pid in present else None,
                             calibration, (study or {}).get("flops_convention"), detect_warmup)
        rows.append(row)
        times.append(t)
        constants.append(c)
        ids.append(pid)
    step, dists = step_columns(times, [_seed(pid) for pid in ids], constants)
    cis = dict(zip(ids, zip(step["step_time_ci_lo_s"].tolist(), step["step_time_ci_hi_s"].tolist())))
    runs = pd.DataFrame(rows)
    for c, v in step.items():
        runs[c] = v
    runs["study"] = (study or {}).get("name") or study_dir.name
    for c in RUN_COLUMNS:
        if c not in runs.columns:
            runs[c] = np.nan
    runs = runs[RUN_COLUMNS]
    efficiency, messages = efficiency_rows(runs, dict(zip(ids, times)), study,
                                           dict(zip(ids, dists)), cis)
    if cal_problem:
        messages.append(f"{cal_problem}: no measured ceiling used")
    context = {"study": study, "calibration": calibration, "messages": messages,
               "convention": convention, "times": dict(zip(ids, times))}
    return runs, efficiency, context
