"""``python -m benchmarks`` (``make bench``): the performance figures, each next to its target.

    python -m benchmarks [trainer] [harness] [scale] [gpu] [predict] [foreign] [tune]
                         [--out results/bench] [--quick] [--points 10000] [--smoke]
                         [--gpu-configs eager,eager-ac,compile] [--pairs 3]

Run from the repository root (the benchmarks are not part of the installed package). Without
names it runs trainer, harness and scale, gpu (on a GPU host the ~1B model; without a GPU a
CPU smoke run of the same path with a tiny model, labelled as such) and predict (the
performance model against the study's measured step times, beside the host's own run-to-run
noise; it reads the harness benchmark's sweep when both run in one call, else it runs the
study itself), and foreign (the built-in trainer vs torchtitan on the same Llama shape,
batch, FSDP and world size; skipped with the reason where torchtitan is not installed:
``make setup-foreign``), and tune (the layout search against the measured grid of 33
layouts, 5 seeds, against random search and the model-only pick; ~25 minutes on 2 cores).
Writes to ``--out`` (atomically): ``<name>.json`` (the full record of each benchmark),
``figures.csv`` (tidy: one row per figure with target, verdict, host and load average) and
``figures.md`` (the printed table). Timings are never asserted in tests; this is where they
are read. The machine's load average is recorded beside every figure: on a shared host, read
the figures with it.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import os
import platform
import socket
import sys
import time
from pathlib import Path

from scalestudy.record.io import write_json, write_text

NAMES = ("trainer", "harness", "scale", "gpu", "predict", "foreign", "tune")
FIELDS = ("benchmark", "figure", "value", "unit", "target", "op", "met", "note", "host",
          "cpu", "load_1min_start", "load_1min_end", "measured_at")


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def host_info() -> dict:
    from scalestudy.config.devices import cpu_name, usable_cpus

    return {"host": socket.gethostname(), "cpu": cpu_name(), "cores": usable_cpus(),
            "python": platform.python_version(), "platform": platform.platform()}


def fmt_value(value, unit: str) -> str:
    """A figure's value for the table (fractions as percentages)."""
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    if unit == "fraction":
        return f"{100 * value:+.1f}%" if value < 0 else f"{100 * value:.1f}%"
    if unit == "s":
        return f"{value:.2f} s" if value < 10 else f"{value:.1f} s"
    if unit == "tokens/s":
        return f"{value:,.0f} tok/s"
    if unit == "GB":
        return f"{value:.2f} GB"
    return f"{value:.4g} {unit}".strip()


def table(rows: list[dict]) -> str:
    """Markdown table: figure, value, target, verdict, note."""
    lines = ["| benchmark | figure | value | target | met | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        target = "" if r["target"] is None else f"{r['op']} {fmt_value(r['target'], r['unit'])}"
        met = {True: "yes", False: "NO", None: ""}[r["met"]]
        note = str(r.get("note") or "").replace("|", "/")
        lines.append(f"| {r['benchmark']} | {r['figure']} | {fmt_value(r['value'], r['unit'])} "
                     f"| {target} | {met} | {note} |")
    return "\n".join(lines) + "\n"


def _csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return torch.cuda.is_available()


def run_one(name: str, args, workdir: Path, done: dict | None = None) -> dict:
    """Run benchmark ``name`` with the parsed CLI ``args``; returns its record. ``done``: the
    records of the benchmarks already run in this call (``predict`` reuses the harness's
    sweep)."""
    done = done or {}
    if name == "trainer":
        from benchmarks import trainer

        rounds, block = (11, 1) if args.quick else (101, 1)
        base = trainer.default_point()
        recs = [trainer.measure(base, rounds=rounds, block=block, label="default study N=1")]
        if not args.quick:  # a model where Python overhead is a smaller share of a step
            big = trainer.scaled_point(base, hidden=256, layers=4, heads=4, seq_len=128)
            recs.append(trainer.measure(big, rounds=21, block=1, label="d256 l4 s128"))
        return {"runs": recs, "figures": [f for r in recs for f in r["figures"]]}
    if name == "harness":
        from benchmarks import harness

        return harness.measure(args.study, workdir / "harness", timeout=args.timeout,
                               snakemake_args=args.snakemake_args.split() or None)
    if name == "scale":
        from benchmarks import scale

        n = args.points or (2000 if args.quick else 10_000)
        return scale.measure(n, workdir / "scale", dry_run=not args.no_dry_run,
                             profile=args.profile, aggregate_timeout=args.scale_timeout,
                             dry_run_timeout=args.scale_timeout)
    if name == "gpu":
        from benchmarks import gpu

        smoke = args.smoke or not _has_cuda()
        configs = args.gpu_configs.split(",") if args.gpu_configs else None
        rec = gpu.measure(workdir / "gpu", smoke=smoke, configs=configs,
                          micro_batch=args.micro_batch, steps=args.steps, budget_s=args.budget)
        if smoke:
            for f in rec["figures"]:
                f["note"] = ("CPU smoke run (tiny model, no GPU here): checks the path, "
                             "not a performance figure; " + f["note"])
        return rec
    if name == "predict":
        from benchmarks import predict

        study_dir = None
        if "harness" in done:  # the same study, run moments ago: read its predict job
            from scalestudy.config.study import load_study

            harness_rec = done["harness"]
            study = load_study(harness_rec["study"])
            study_dir = Path(harness_rec["workdir"]) / "results" / study.name
        rec = predict.measure(args.study, workdir / "predict", study_dir=study_dir,
                              timeout=args.timeout)
        # the same study's traces: what the profiler cost, the model term by term
        from benchmarks import breakdown

        for part in (breakdown.overhead(Path(rec["study_dir"])),
                     breakdown.terms(Path(rec["study_dir"]))):
            rec["figures"] += part["figures"]
        # the host's noise on one fixed product, beside the repeats' noise of the study
        noise = predict.matmul_noise()
        rec["matmul_noise"] = {k: v for k, v in noise.items() if k != "figures"}
        rec["figures"] += noise["figures"]
        # the bench's own N = 1, 2, 4, 8 study: N = 4 and 8 predicted before they run
        before = predict.measure_before_run(workdir / "predict-before-run", timeout=args.timeout)
        rec["before_run"] = before["points"]
        rec["figures"] += before["figures"]
        validation = predict.validate()  # one process: the model's arithmetic on real steps
        rec["validate"] = validation["rows"]
        rec["figures"] += validation["figures"]
        return rec
    if name == "foreign":
        import importlib.util

        from benchmarks import figure as _figure
        from benchmarks import foreign

        missing = [m for m in ("torchtitan", "triton") if importlib.util.find_spec(m) is None]
        if missing:
            return {"skipped": f"{', '.join(missing)} not installed (make setup-foreign)",
                    "figures": [_figure("foreign", "built-in trainer / torchtitan tokens/s",
                                        None, "x", foreign.TARGET, ">=",
                                        f"not measured: {', '.join(missing)} not installed "
                                        "(make setup-foreign)")]}
        pairs = args.pairs or (1 if args.quick else 3)
        return foreign.measure(workdir / "foreign", pairs=pairs)
    if name == "tune":
        from benchmarks import tune

        return tune.measure(workdir / "tune")
    raise ValueError(f"unknown benchmark {name!r}; use one of {', '.join(NAMES)}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run: {', '.join(NAMES)} (default: all)")
    p.add_argument("--out", type=Path, default=Path("results/bench"))
    p.add_argument("--workdir", type=Path, default=None,
                   help="scratch space (default: a new temporary directory)")
    p.add_argument("--quick", action="store_true", help="fewer rounds, 2000-point scale study")
    p.add_argument("--study", default=None,
                   help="harness, predict: study file (default: default.yaml)")
    p.add_argument("--timeout", type=float, default=1800,
                   help="harness, predict: sweep timeout (s)")
    p.add_argument("--snakemake-args", default="",
                   help="harness: extra snakemake arguments, e.g. '--force-use-threads'")
    p.add_argument("--points", type=int, default=None, help="scale: planned runs (default 10000)")
    p.add_argument("--no-dry-run", action="store_true", help="scale: skip snakemake -n")
    p.add_argument("--scale-timeout", type=float, default=300,
                   help="scale: bound on aggregation and on snakemake -n (s); past it the "
                        "figure is reported as not finished")
    p.add_argument("--profile", action="store_true", help="scale: cProfile plan and aggregate")
    p.add_argument("--smoke", action="store_true", help="gpu: tiny model on the CPU")
    p.add_argument("--gpu-configs", default=None,
                   help="gpu: comma-separated of eager, eager-ac, compile, compile-ac")
    p.add_argument("--micro-batch", type=int, default=None, help="gpu: sequences per step")
    p.add_argument("--steps", type=int, default=None, help="gpu: optimizer steps (5 warm-up)")
    p.add_argument("--pairs", type=int, default=None,
                   help="foreign: alternating pairs of runs (default 3; --quick 1)")
    p.add_argument("--budget", type=float, default=None,
                   help="gpu: seconds for all configurations (later ones are skipped)")
    return p


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    names = args.names or list(NAMES)
    bad = [n for n in names if n not in NAMES]
    if bad:
        print(f"python -m benchmarks: unknown benchmark {bad[0]!r}; use {', '.join(NAMES)}",
              file=sys.stderr)
        return 2
    out = args.out
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="scalestudy-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    info = host_info()
    new_rows: list[dict] = []
    done: dict[str, dict] = {}
    for name in names:
        load0, t0 = _load(), time.monotonic()
        print(f"== bench {name} (load average {load0}) ...", file=sys.stderr, flush=True)
        rec = run_one(name, args, workdir, done)
        done[name] = rec
        load1 = _load()
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        rec.update(host=info, load_1min_start=load0, load_1min_end=load1, measured_at=stamp,
                   bench_elapsed_s=time.monotonic() - t0)
        write_json(out / f"{name}.json", rec)
        rows = [dict(f, host=info["host"], cpu=info["cpu"], load_1min_start=load0,
                     load_1min_end=load1, measured_at=stamp) for f in rec["figures"]]
        print(table(rows), flush=True)
        new_rows += rows
    all_rows: list[dict] = []
    if (out / "figures.csv").exists():  # keep the figures of benchmarks not rerun now
        with open(out / "figures.csv") as f:
            all_rows = [r for r in csv.DictReader(f) if r["benchmark"] not in names]
    all_rows += new_rows
    for r in all_rows:  # rows read back from CSV are strings
        for k in ("value", "target"):
            if isinstance(r.get(k), str):
                r[k] = float(r[k]) if r[k] not in ("", "None") else None
        if isinstance(r.get("met"), str):
            r["met"] = {"True": True, "False": False}.get(r["met"])
    write_text(out / "figures.csv", _csv(all_rows))
    md = (f"Host {info['host']}: {info['cpu']}, {info['cores']} usable cores. Load average "
          f"(1 min) beside each figure in figures.csv.\n\n" + table(all_rows))
    write_text(out / "figures.md", md)
    print(f"\nwritten: {out}/figures.csv, figures.md, " +
          ", ".join(f"{n}.json" for n in names) + f" (scratch: {workdir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
