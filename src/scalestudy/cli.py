"""``scalestudy``: the study pipeline for people who don't want to type snakemake.

    scalestudy plan STUDY.yaml            print the sweep (feasible and skipped points)
    scalestudy run STUDY.yaml [-- ARGS]   validate, then run the Snakemake DAG (+ report.html)
    scalestudy aggregate RESULTS/STUDY    tables: runs.csv, efficiency.csv, summary.md
    scalestudy plot RESULTS/STUDY         figures/
    scalestudy predict | tune ...         performance model (see --help of each)

A bad study file ends with one line naming the field and the fix, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

from scalestudy import paths
from scalestudy.config.point import PointError
from scalestudy.config.study import StudyError

# subcommands implemented by other modules' main(argv)
DELEGATED = {
    "predict": "scalestudy.perf.predict",
    "tune": "scalestudy.perf.tune",
    "run-point": "scalestudy.run.runner",
}
PLAN_VIEW = ["point_id", "mode", "n", "dp", "tp", "pp", "micro_batch", "grad_accum",
             "global_batch", "tokens_per_step", "feasible", "reason"]


def _load(path: str):
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.study import load_study

    study = load_study(path)
    return study, plan_points(study, path)


def cmd_plan(args) -> int:
    from scalestudy.plan.planner import plan_rows, write_plan

    study, points = _load(args.study)
    rows = plan_rows(points)
    if args.write:
        write_plan(points, Path(args.results) / study["name"])
    table = [PLAN_VIEW] + [["" if r[k] is None else str(r[k]) for k in PLAN_VIEW] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(PLAN_VIEW))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    n_ok = sum(p.feasible for p in points)
    print(f"\n{study['name']}: {len(points)} runs planned, {n_ok} feasible, "
          f"{len(points) - n_ok} skipped")
    return 0


def snakemake_argv(study: str, results: str, profile: str | None, extra: list[str]) -> list[str]:
    # Snakemake's metadata and locks live beside the results (one .snakemake per results root)
    Path(results).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(paths.snakefile()),
            "--directory", str(Path(results).resolve())]
    if profile:
        argv += ["--profile", profile]
    argv += ["--config", f"study={Path(study).resolve()}", f"results={Path(results).resolve()}"]
    return argv + extra


def cmd_run(args) -> int:
    study, _ = _load(args.study)  # fail fast, before Snakemake starts anything
    extra = args.snakemake_args
    args.profile = args.profile or str(paths.profile("local"))
    argv = snakemake_argv(args.study, args.results, args.profile, extra)
    rc = subprocess.call(argv)
    locks = Path(args.results).resolve() / ".snakemake" / "locks"
    if rc != 0 and locks.is_dir() and any(locks.iterdir()):
        print(f"scalestudy: error: another run of a study in {args.results} holds Snakemake's "
              "lock; wait for it to finish, or if none is running (a killed run left the lock), "
              f"run: scalestudy run {args.study} --results {args.results} -- --unlock",
              file=sys.stderr)
        return rc
    if rc == 0 and not args.no_report and not {"-n", "--dry-run", "--dryrun"} & set(extra):
        report = Path(args.results).resolve() / study["name"] / "report.html"
        rc = subprocess.call(snakemake_argv(args.study, args.results, args.profile, [])
                             + ["--report", str(report)])
    return rc


def cmd_aggregate(args) -> int:
    from scalestudy.analysis import aggregate

    aggregate.run(Path(args.study_dir))
    return 0


def cmd_plot(args) -> int:
    from scalestudy.report import plots

    for path in plots.run(Path(args.study_dir)):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scalestudy", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the sweep points of a study")
    p.add_argument("study")
    p.add_argument("--write", action="store_true", help="also write RESULTS/<name>/plan.tsv")
    p.add_argument("--results", default="results")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("run", help="run a study through Snakemake")
    p.add_argument("study")
    p.add_argument("--results", default="results")
    p.add_argument("--profile", default=None,
                   help="Snakemake profile folder (default: the shipped workflow/profiles/local)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.set_defaults(func=cmd_run)
    for name, fn in (("aggregate", cmd_aggregate), ("plot", cmd_plot)):
        p = sub.add_parser(name, help=f"{name} the runs of RESULTS/<study>")
        p.add_argument("study_dir")
        p.set_defaults(func=fn)
    for name in DELEGATED:
        sub.add_parser(name, add_help=False, help=f"see scalestudy {name} --help")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return int(importlib.import_module(DELEGATED[argv[0]]).main(argv[1:]) or 0)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # run: for snakemake
    args = build_parser().parse_args(argv[:len(argv) - len(extra) - bool(extra or "--" in argv)])
    args.snakemake_args = extra
    try:
        return int(args.func(args) or 0)
    except (StudyError, PointError) as e:
        print(f"scalestudy: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
