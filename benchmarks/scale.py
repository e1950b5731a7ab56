"""Pipeline scale: plan, aggregate and ``snakemake -n`` a 10,000-point study.

``synthetic_study(n)`` builds a valid study of exactly ``n`` planned runs (weak and strong
series over N = 1..512 on 8-device nodes, each swept over two checkpointing and two DP modes,
memory-checked against an H200; N=512 needs more nodes than the 32 allowed, so
it is planned as infeasible). ``write_records`` fills a results directory with run records
in the documented formats (docs/architecture.md: ``point.json``, ``steps.jsonl``,
``summary.json``, ``status.json``, ``env.json``; mostly ``ok``, some ``oom`` / ``crashed`` /
``timeout``, some not run). Timed: load + validate + plan + ``plan.tsv``; ``python -m
scalestudy aggregate``
(``runs.csv``, ``runs.parquet``, ``efficiency.csv``, ``summary.md``); ``snakemake -n`` on the
study (fresh results directory, so every point is a job). Nothing else runs in between.
"""

from __future__ import annotations

import cProfile
import io
import json
import math
import pstats
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import figure
from scalestudy.config.point import Point

GPUS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
SWEEP = {"activation_checkpointing": ["none", "full"], "dp_mode": ["ddp", "fsdp"]}
PER_SERIES = len(GPUS) * 4
TARGET_PLAN_S = 10.0
TARGET_AGGREGATE_S = 10.0
TARGET_DRYRUN_S = 60.0


def synthetic_study(n_points: int = 10_000, name: str = "scale") -> dict:
    """A valid study with exactly ``n_points`` planned runs (a multiple of 40 series points
    times repeats; remainder via repeats is not used: ``n_points`` must be a multiple of 40)."""
    if n_points % PER_SERIES:
        raise ValueError(f"n_points={n_points} must be a multiple of {PER_SERIES}")
    series = []
    for i in range(n_points // PER_SERIES):
        s = {"name": f"s{i:04d}", "model": "m", "gpus": list(GPUS), "micro_batch": 1 + i,
             **SWEEP}
        if i % 2:
            s.update(mode="strong", global_batch=512 * (1 + i))
        else:
            s.update(mode="weak", grad_accum=2)
        series.append(s)
    return {
        "name": name,
        "models": {"m": {"layers": 8, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 1024}},
        "train": {"steps": 12, "warmup_steps": 3, "precision": "bf16"},
        "platform": {"device": "cuda", "hardware": "H200-SXM", "devices_per_node": 8,
                     "max_nodes": 32},
        "series": series,
    }


def write_records(points: list[Point], study_dir: Path, seed: int = 0) -> int:
    """Synthetic run records for the feasible points (plain writes: it is test data).
    Returns the number of run directories written."""
    import random

    from scalestudy.config.vocab import FlopsConvention
    from scalestudy.config import flops

    rng = random.Random(seed)
    runs = Path(study_dir) / "runs"
    written = 0
    for k, p in enumerate(points):
        if not p.feasible:
            continue
        d = runs / p.point_id
        d.mkdir(parents=True, exist_ok=True)
        (d / "point.json").write_text(p.json_text())
        written += 1
        fate = k % 50
        if fate == 49:  # not run yet: point.json only
            continue
        state = {47: "oom", 48: "crashed", 46: "timeout"}.get(fate, "ok")
        status = {"state": state, "reason": "" if state == "ok" else f"synthetic {state}",
                  "evidence": [], "exit_code": 0 if state == "ok" else 1,
                  "started": "2026-01-01T00:00:00+00:00", "finished": "2026-01-01T00:01:00+00:00",
                  "wall_s": 60.0}
        if state == "ok":
            cfg = p.model
            rows = int(p.global_batch)
            mf = {c.value: flops.model_flops_per_step(cfg, rows, c) for c in FlopsConvention}
            t = mf["megatron"] / (p.n * 400e12) * (1 + 0.05 * math.log2(p.n))
            steps = [{"step": i, "loss": 7.0 - 0.1 * i, "tokens": p.tokens_per_step,
                      "step_time_s": t * (1.5 if i < 3 else rng.lognormvariate(0, 0.02)),
                      "warmup": i < 3} for i in range(12)]
            (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
            summary = {
                "point_id": p.point_id, "config_hash": p.config_hash, "repeat": p.repeat,
                "n_params": flops.param_count(cfg), "steps": 12, "warmup_steps": 3,
                "loss_first": 7.0, "loss_last": 5.9, "tokens_per_step": p.tokens_per_step,
                "step_time_median_s": t, "tokens_per_s": p.tokens_per_step / t,
                "model_flops_per_step": mf,
                "hardware_flops_per_step": {c: flops.hardware_flops_per_step(
                    cfg, rows, c, p.parallel.activation_checkpointing) for c in mf},
                "device_type": "cuda", "device_name": "NVIDIA H200", "hardware": "H200-SXM",
                "dtype": "bf16", "peak_flops_per_device": 989e12,
                "peak_source": "NVIDIA H200 datasheet", "peak_memory_bytes": 40 * 2**30,
                "memory_kind": "cuda_max_allocated", "train_wall_s": 12 * t + 5,
            }
            (d / "summary.json").write_text(json.dumps(summary))
            (d / "env.json").write_text(json.dumps({"torch": "2.13.0", "backend": "nccl",
                                                    "config_hash": p.config_hash}))
        (d / "status.json").write_text(json.dumps(status))
    return written


def _profile_top(prof: cProfile.Profile, n: int = 15) -> str:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(n)
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    return s.getvalue()


def measure(n_points: int = 10_000, workdir: str | Path | None = None, *, dry_run: bool = True,
            profile: bool = False, dry_run_timeout: float = 600,
            aggregate_timeout: float = 600) -> dict:
    """Time planning, aggregation and ``snakemake -n`` at ``n_points``; returns the record."""
    import tempfile

    from scalestudy.report.aggregate import aggregate_study
    from scalestudy.record.io import write_json
    from scalestudy.plan.planner import plan_points, write_plan
    from scalestudy.config.study import load_study
    from scalestudy.config.study_yaml import dump_study

    workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    study_file = workdir / "scale.yaml"
    study_file.write_text(dump_study(synthetic_study(n_points)))  # shared lists written out
    study_dir = workdir / "results" / "scale"
    rec: dict = {"n_points": n_points, "workdir": str(workdir)}

    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    study = load_study(study_file)
    points = plan_points(study)
    write_plan(points, study_dir)
    if prof:
        prof.disable()
    rec["plan_s"] = time.perf_counter() - t0
    rec["plan_profile"] = _profile_top(prof) if prof else None
    rec["n_planned"] = len(points)
    rec["n_feasible"] = sum(p.feasible for p in points)

    write_json(study_dir / "study.json", study.to_json())
    t0 = time.perf_counter()
    rec["n_run_dirs"] = write_records(points, study_dir)
    rec["write_records_s"] = time.perf_counter() - t0

    # Aggregation as the pipeline runs it (its own process, imports included), bounded;
    # with ``profile`` in this process under cProfile instead.
    t0 = time.perf_counter()
    rec["aggregate_rc"] = 0
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        aggregate_study(study_dir)
        prof.disable()
        rec["aggregate_profile"] = _profile_top(prof, 30)
    else:
        with open(workdir / "aggregate.log", "w") as f:
            try:
                rec["aggregate_rc"] = subprocess.run(
                    [sys.executable, "-m", "scalestudy", "aggregate", str(study_dir)], stdout=f,
                    stderr=subprocess.STDOUT, timeout=aggregate_timeout).returncode
            except subprocess.TimeoutExpired:
                rec["aggregate_rc"] = "timeout"
    rec["aggregate_s"] = time.perf_counter() - t0

    rec["dry_run_s"] = None
    if dry_run:
        from scalestudy import paths
        from scalestudy.run.snakemake import snakemake_argv

        argv = snakemake_argv(str(study_file), str(workdir / "dry"),
                              str(paths.profile("local")), ["-n", "--quiet"])
        t0 = time.perf_counter()
        with open(workdir / "dryrun.log", "w") as f:
            try:
                rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT,
                                    timeout=dry_run_timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        rec["dry_run_s"] = time.perf_counter() - t0
        rec["dry_run_rc"] = rc

    feas = rec["n_feasible"]
    rec["figures"] = [
        figure("scale", f"plan {n_points} points (load, validate, plan, plan.tsv)", rec["plan_s"],
               "s", TARGET_PLAN_S, "<=", f"{feas} feasible"),
        figure("scale", f"aggregate {rec['n_run_dirs']} synthetic run records",
               rec["aggregate_s"] if rec["aggregate_rc"] == 0 else None, "s",
               TARGET_AGGREGATE_S, "<=",
               "python -m scalestudy aggregate: runs.csv, runs.parquet, efficiency.csv, "
               "summary.md" if rec["aggregate_rc"] == 0 else
               f"did not finish ({rec['aggregate_rc']}) in {aggregate_timeout:g} s; see "
               "aggregate.log / --profile"),
    ]
    if dry_run:
        ok = rec["dry_run_rc"] == 0
        rec["figures"].append(figure(
            "scale", f"snakemake -n on the {n_points}-point study",
            rec["dry_run_s"] if ok else None, "s", TARGET_DRYRUN_S, "<=",
            f"{2 * feas + 5} jobs" if ok else f"failed ({rec['dry_run_rc']}); see dryrun.log"))
    return rec
