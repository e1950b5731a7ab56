"""Harness overhead: what a real sweep costs beyond the training processes' own time.

Runs the study exactly as ``scalestudy run`` does (the Snakemake sweep, then
``snakemake --report``) into a fresh results directory, then splits the sweep's wall time:

- ``training``: the training processes' own time, the sum of ``summary.json`` ``train_wall_s``
  (from ``train.run`` entry -- after ``import torch`` -- to the run record);
- ``torchrun start-up``: the sum of ``status.json`` ``wall_s`` (the runner's clock around
  torchrun) minus ``train_wall_s``: launcher start, ``import torch`` in every rank, rendezvous,
  process-group set-up and teardown;
- ``runner``: train-job duration in the Snakemake log minus ``status.json`` ``wall_s``
  (the runner's own Python start-up; the log has 1 s resolution);
- ``calibration``, ``aggregation``, ``plotting``: those jobs' durations in the Snakemake log;
- ``snakemake``: the rest (DAG building, the spawned ``run:`` jobs ``plan`` / ``point_spec``
  while they block the timed jobs, scheduling latency).

The floor for start-up is measured too: an empty torchrun job (``import torch``,
``init_process_group``, barrier, ``destroy_process_group``, then the same fast exit as a
trainer rank: no interpreter teardown) at each N of the study.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from benchmarks import figure

_STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
_START = re.compile(r"^(?:local)?rule (\w+):$")
_JOBID = re.compile(r"^\s+jobid: (\d+)$")
_FINISH = re.compile(r"^Finished jobid: (\d+) \(Rule: (\w+)\)$")


def parse_snakemake_log(text: str) -> list[dict]:
    """Jobs of a Snakemake (9.x) log: ``[{jobid, rule, start, finish, duration_s}]``, times as
    POSIX seconds (the log has whole seconds); unfinished jobs get ``finish=None``."""
    jobs: dict[int, dict] = {}
    stamp = None
    pending_rule = None
    for line in text.splitlines():
        m = _STAMP.match(line.strip())
        if m:
            stamp = datetime.strptime(" ".join(m.group(1).split()), "%a %b %d %H:%M:%S %Y").timestamp()
            continue
        m = _START.match(line)
        if m:
            pending_rule = (m.group(1), stamp)
            continue
        m = _JOBID.match(line)
        if m and pending_rule:
            jid = int(m.group(1))
            jobs[jid] = {"jobid": jid, "rule": pending_rule[0], "start": pending_rule[1],
                         "finish": None, "duration_s": None}
            pending_rule = None
            continue
        m = _FINISH.match(line.strip())
        if m and int(m.group(1)) in jobs:
            j = jobs[int(m.group(1))]
            j["finish"] = stamp
            if stamp is not None and j["start"] is not None:
                j["duration_s"] = stamp - j["start"]
    return list(jobs.values())


def run_records(study_dir: Path) -> list[dict]:
    """Per run dir: point id, N, ``train_wall_s`` and ``status.json`` ``wall_s`` / state."""
    out = []
    for run in sorted((Path(study_dir) / "runs").iterdir()):
        try:
            status = json.loads((run / "status.json").read_text())
        except (OSError, ValueError):
            continue
        try:
            summary = json.loads((run / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        try:
            n = int(json.loads((run / "point.json").read_text())["n"])
        except (OSError, ValueError, KeyError):
            n = None
        out.append({"point_id": run.name, "n": n, "state": status.get("state"),
                    "status_wall_s": status.get("wall_s"),
                    "train_wall_s": summary.get("train_wall_s")})
    return out


def split(sweep_wall_s: float, runs: list[dict], jobs: list[dict]) -> dict:
    """Split a sweep's wall time into its parts (seconds); see the module docstring. Pure."""
    def dur(rule):
        return sum(j["duration_s"] or 0.0 for j in jobs if j["rule"] == rule)

    train_own = sum(r["train_wall_s"] or 0.0 for r in runs)
    status = sum(r["status_wall_s"] or 0.0 for r in runs)
    train_jobs = dur("train")
    parts = {
        "training": train_own,
        "torchrun_startup": status - train_own,
        "runner": max(train_jobs - status, 0.0),
        "calibration": dur("calibrate"),
        "aggregation": dur("aggregate"),
        "plotting": dur("plots"),
    }
    parts["snakemake"] = sweep_wall_s - sum(parts.values())
    return {
        "sweep_wall_s": sweep_wall_s, "parts_s": parts,
        "overhead_s": sweep_wall_s - train_own,
        "overhead_fraction": (sweep_wall_s - train_own) / sweep_wall_s if sweep_wall_s else None,
        "run_jobs_s": {"plan": dur("plan"), "point_spec": dur("point_spec")},
        "n_runs": len(runs), "n_ok": sum(r["state"] == "ok" for r in runs),
    }


_NOOP = ("import os, torch, torch.distributed as d; d.init_process_group('gloo'); d.barrier(); "
         "d.destroy_process_group(); os._exit(0)")  # ends like a trainer rank (process_exit.exit_now)


def startup_floor(n: int, repeats: int = 1, timeout: float = 300) -> float:
    """Wall seconds of an empty torchrun job with ``n`` processes, launched like a point
    (``scalestudy.run.launch``'s argv): the floor of per-point start-up. Median of ``repeats``."""
    import tempfile

    from scalestudy.config.point import Point
    from scalestudy.config.parts import Model
    from scalestudy.config.identity import identify
    from scalestudy.run import launch

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "noop.py"
        script.write_text(_NOOP + "\n")
        # a one-node CPU point of n processes (only its launch line is used)
        point = identify(Point.for_layout(Model(), dp=n, device="cpu", devices_per_node=n,
                                          series=f"noop-n{n}"))
        argv = launch.launch_argv(point, tmp)
        argv = argv[:argv.index("-m", 3)] + [str(script)]
        env = {**os.environ, **launch.launch_env(point, os.environ)}
        for _ in range(repeats):
            t0 = time.monotonic()
            subprocess.run(argv, env=env, check=True, timeout=timeout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.monotonic() - t0)
    return statistics.median(times)


def _timed(argv: list[str], log: Path, timeout: float, cwd: Path | None = None) -> tuple[float, int]:
    t0 = time.monotonic()
    with open(log, "w") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                            cwd=cwd).returncode
    return time.monotonic() - t0, rc


def measure(study_file: str | Path | None = None, workdir: str | Path | None = None, *,
            timeout: float = 1800, floor: bool = True,
            snakemake_args: list[str] | None = None) -> dict:
    """Run the sweep of ``study_file`` (default: workflow/config/default.yaml) into
    ``workdir``/results and account for its wall time. Returns the record (seconds).
    ``snakemake_args`` are added to the sweep's command line (e.g. ``--force-use-threads``
    to try a fix)."""
    import tempfile

    from scalestudy import paths
    from scalestudy.run.snakemake import snakemake_argv
    from scalestudy.config.study import load_study

    study_file = Path(study_file or paths.workflow_dir() / "config" / "default.yaml").resolve()
    study = load_study(study_file)
    own_tmp = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="scalestudy-bench-harness-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = workdir / "results"
    profile = str(paths.profile("local"))
    extra = list(snakemake_args or [])
    sweep_s, rc = _timed(snakemake_argv(str(study_file), str(results), profile, extra),
                         workdir / "sweep.log", timeout)
    if rc != 0:
        raise RuntimeError(f"the sweep failed (exit {rc}); see {workdir / 'sweep.log'}")
    report = results / study.name / "report.html"
    report_s, rc_report = _timed(snakemake_argv(str(study_file), str(results), profile, [])
                                 + ["--report", str(report)], workdir / "report.log", timeout)
    logs = sorted((results / ".snakemake" / "log").glob("*.snakemake.log"))
    jobs = parse_snakemake_log(logs[0].read_text()) if logs else []
    study_dir = results / study.name
    runs = run_records(study_dir)
    rec = split(sweep_s, runs, jobs)
    rec.update(study=str(study_file), workdir=str(workdir), report_s=report_s,
               snakemake_args=extra,
               report_ok=rc_report == 0, jobs=jobs, runs=runs)

    # Re-time the cheap steps precisely (the log has 1 s resolution); both are idempotent.
    py = sys.executable
    rec["aggregate_direct_s"], _ = _timed([py, "-m", "scalestudy", "aggregate", str(study_dir)],
                                          workdir / "aggregate.log", 600)
    rec["plot_direct_s"], _ = _timed([py, "-m", "scalestudy.cli", "plot", str(study_dir)],
                                     workdir / "plot.log", 600)
    rec["dry_run_s"], _ = _timed(snakemake_argv(str(study_file), str(results), profile,
                                                ["-n", "--forceall", "--quiet", "all"]),
                                 workdir / "dryrun.log", 600)
    rec["runner_import_s"], _ = _timed([py, "-c", "import scalestudy.run.runner"],
                                       workdir / "imp.log", 120)
    rec["torch_import_s"], _ = _timed([py, "-c", "import torch"], workdir / "imp.log", 300)

    ns = sorted({r["n"] for r in runs if r["n"]})
    rec["startup_floor_s"] = {n: startup_floor(n) for n in ns} if floor else {}
    excess = [(r["status_wall_s"] - r["train_wall_s"]) - rec["startup_floor_s"][r["n"]]
              for r in runs if r["train_wall_s"] and r["n"] in rec["startup_floor_s"]]
    rec["startup_excess_per_point_s"] = statistics.median(excess) if excess else None

    p, n = rec["parts_s"], max(rec["n_runs"], 1)
    rec["figures"] = [
        figure("harness", "sweep wall time" + (f" ({' '.join(extra)})" if extra else ""),
               sweep_s, "s",
               note=f"{rec['n_ok']}/{rec['n_runs']} runs ok; report.html {report_s:.1f} s more"),
        figure("harness", "harness overhead (sweep wall - training processes' own time)",
               rec["overhead_s"], "s",
               note=f"{100 * rec['overhead_fraction']:.0f}% of the sweep; training {p['training']:.1f} s"),
        figure("harness", "  torchrun start-up + teardown", p["torchrun_startup"], "s",
               note=f"{p['torchrun_startup'] / n:.1f} s per point"),
        figure("harness", "  runner processes", p["runner"], "s", note="log resolution 1 s"),
        figure("harness", "  calibration job", p["calibration"], "s"),
        figure("harness", "  aggregation job", p["aggregation"], "s",
               note=f"direct re-run {rec['aggregate_direct_s']:.1f} s"),
        figure("harness", "  plotting job", p["plotting"], "s",
               note=f"direct re-run {rec['plot_direct_s']:.1f} s"),
        figure("harness", "  snakemake (DAG, spawned run: jobs, scheduling)", p["snakemake"], "s",
               note=f"snakemake -n alone {rec['dry_run_s']:.1f} s; spawned run: jobs "
                    f"plan+point_spec {sum(rec['run_jobs_s'].values()):.0f} s in total"),
    ]
    if rec["startup_excess_per_point_s"] is not None:
        floors = ", ".join(f"N={k}: {v:.1f} s" for k, v in rec["startup_floor_s"].items())
        rec["figures"].append(figure(
            "harness", "start-up per point beyond an empty torchrun job",
            rec["startup_excess_per_point_s"], "s", 1.0, "<=",
            f"median over points; empty torchrun job {floors}; import torch "
            f"{rec['torch_import_s']:.1f} s"))
    if own_tmp:
        rec["workdir_kept"] = str(workdir)
    return rec
