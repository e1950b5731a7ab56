"""The ``scalestudy`` console command: plan a study, run it through Snakemake, read the results.

``scalestudy --help`` lists the subcommands, one line each; ``scalestudy COMMAND --help`` says
what one does, with an example. ``plan``, ``run``, ``aggregate`` and ``plot`` are defined here;
``predict``, ``tune``, ``run-point``, ``status``, ``compare`` and ``export`` by the modules in
:data:`DELEGATED` (their ``main(argv)``). A bad study file ends with one line naming the field
and the fix, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import signal
import sys
import textwrap
from pathlib import Path

from scalestudy import paths
from scalestudy.config.checks import PointError
from scalestudy.config.study_yaml import StudyError
from scalestudy.run.snakemake import launch, report_env, run_snakemake, snakemake_argv

# subcommands implemented by other modules' main(argv) (delegated_main)
DELEGATED = ("predict", "tune", "run-point", "status", "compare", "export")
# one line per subcommand in ``scalestudy --help`` (each subcommand's --help starts with it)
SUMMARY = {
    "plan": "print the sweep: feasible and skipped points",
    "run": "run a study through Snakemake (+ report.html)",
    "status": "progress of a study: done, failed and why, time left",
    "aggregate": "write the tables of a study's runs again",
    "plot": "draw a study's figures again",
    "compare": "draw several studies on one set of axes",
    "export": "copy a study into MLflow, W&B or TensorBoard",
    "predict": "predict step times and efficiency (performance model)",
    "tune": "search a layout by measuring it (or rank shapes by the model)",
    "run-point": "run one sweep point (what each Snakemake job runs)",
}
DESCRIPTION = """Weak and strong scaling studies of distributed LLM training: plan a sweep, run it
through Snakemake, read the efficiency curves."""
EPILOG = """examples:
  scalestudy plan workflow/config/default.yaml     print the sweep
  scalestudy run workflow/config/default.yaml      run it; results in results/default/
  scalestudy status workflow/config/default.yaml   from another terminal: how far it is
  scalestudy COMMAND --help                        what COMMAND does, with an example

A bad study file ends with one line naming the field and the fix, exit status 2."""
PLAN_VIEW = ["point_id", "mode", "n", "dp", "tp", "pp", "micro_batch", "grad_accum",
             "global_batch", "tokens_per_step", "feasible", "reason"]


def _load(path: str, trust_site: bool = False):
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.study import load_study

    study = load_study(path, trust_site=trust_site)
    return study, plan_points(study, path)


def cmd_plan(args) -> int:
    from scalestudy.plan.planner import plan_rows, write_plan

    study, points = _load(args.study, args.trust_site)
    rows = plan_rows(points)
    if args.write:
        write_plan(points, Path(args.results) / study.name)
    table = [PLAN_VIEW] + [["" if r[k] is None else str(r[k]) for k in PLAN_VIEW] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(PLAN_VIEW))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    n_ok = sum(p.feasible for p in points)
    print(f"\n{study.name}: {len(points)} runs planned, {n_ok} feasible, "
          f"{len(points) - n_ok} skipped")
    return 0


def cmd_run(args) -> int:
    study, _ = _load(args.study, args.trust_site)  # fail fast, before Snakemake starts anything
    if not study.series:
        raise StudyError(f"{args.study}: series: the study has none to run; search its tune: "
                         f"layout with `scalestudy tune {args.study} --measure`")
    extra = args.snakemake_args
    args.profile = args.profile or str(paths.profile("local"))
    rc = launch(args.study, study, args.results, args.profile, extra, args.trust_site)
    if rc < 0:  # Snakemake killed by a signal: its points ended with it
        print(f"scalestudy: error: Snakemake was killed by {signal.Signals(-rc).name}; run the "
              "same command again to go on (a study reruns only its unfinished points)",
              file=sys.stderr)
        return 128 - rc
    if rc == 0 and not args.no_report and not {"-n", "--dry-run", "--dryrun"} & set(extra):
        report = Path(args.results).resolve() / study.name / "report.html"
        rc = run_snakemake(snakemake_argv(args.study, args.results, args.profile, [],
                                          args.trust_site) + ["--report", str(report)],
                           env=report_env())
    return rc


def cmd_aggregate(args) -> int:
    from scalestudy.report.aggregate import aggregate_study

    aggregate_study(Path(args.study_dir))
    return 0


def cmd_plot(args) -> int:
    from scalestudy.report import plots

    for path in plots.run(Path(args.study_dir), style=getattr(args, "style", None)):
        print(path)
    return 0


def _subcommand(sub, name: str, details: str, example: str):
    """A subcommand whose ``--help`` says what it does (its :data:`SUMMARY` line, then
    ``details``) and ends with an example."""
    line = SUMMARY[name]
    return sub.add_parser(name, prog=f"scalestudy {name}",
                          description=textwrap.fill(f"{line[0].upper()}{line[1:]}. {details}", 79),
                          epilog=f"example:\n  {example}",
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def version() -> str:
    """The installed package's version (its metadata), as ``scalestudy --version`` prints it."""
    try:
        return importlib.metadata.version("scalestudy")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scalestudy", usage="%(prog)s [-h] [--version] COMMAND ...",
                                 description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"scalestudy {version()}")
    width = max(map(len, SUMMARY))
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands",
                            help=argparse.SUPPRESS,  # the table below is the listing
                            description="\n".join(f"{n:<{width}}  {line}"
                                                   for n, line in SUMMARY.items()))
    p = _subcommand(sub, "plan", "Reads and checks the study file, derives every point (weak "
                    "or strong scaling) and prints one line each, a skipped one with the reason.",
                    "scalestudy plan workflow/config/default.yaml --write")
    p.add_argument("study", help="study file (YAML)")
    p.add_argument("--write", action="store_true", help="also write RESULTS/<name>/plan.tsv")
    p.add_argument("--results", default="results", help="results root (default: results)")
    p.add_argument("--trust-site", action="store_true",
                   help="accept any site.env variable and more site options (see run)")
    p.set_defaults(func=cmd_plan)
    p = _subcommand(sub, "run", "Checks the study and the profile's site, then runs the "
                    "Snakemake DAG: training points, tables, figures, then report.html. "
                    "Arguments after -- go to Snakemake.",
                    "scalestudy run workflow/config/default.yaml -- --dry-run")
    p.add_argument("study", help="study file (YAML)")
    p.add_argument("--results", default="results", help="results root (default: results)")
    p.add_argument("--profile", default=None,
                   help="Snakemake profile folder (default: the shipped workflow/profiles/local)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--trust-site", action="store_true",
                   help="let the site settings (study platform.site, the profile's site.yaml) "
                   "set any environment variable (LD_PRELOAD, PYTHONPATH, ...) and any srun/sbatch "
                   "option, and torchrun's --log-dir/--logs-specs; only for files you wrote "
                   "(passed to Snakemake as --config trust_site=true)")
    p.set_defaults(func=cmd_run)
    p = _subcommand(sub, "aggregate", "Reads every run record of RESULTS/<study> and writes "
                    "runs.csv, runs.parquet, efficiency.csv, summary.md and summary.tex.",
                    "scalestudy aggregate results/default")
    p.add_argument("study_dir", help="the study's results folder (RESULTS/<study>)")
    p.set_defaults(func=cmd_aggregate)
    p = _subcommand(sub, "plot", "Draws the efficiency, throughput and MFU figures of "
                    "RESULTS/<study> into its figures/ folder (.png, .pdf and the .csv behind "
                    "each).",
                    "scalestudy plot results/default --style single-column")
    p.add_argument("study_dir", help="the study's results folder (RESULTS/<study>)")
    from scalestudy.config.vocab import FigureStyle

    p.add_argument("--style", choices=[str(s) for s in FigureStyle], default=None,
                   help="figure width and fonts for a paper (default: the study's "
                        "report.figure_style)")
    p.set_defaults(func=cmd_plot)
    for name in DELEGATED:  # (main() hands their arguments to the module)
        sub.add_parser(name, add_help=False)
    return ap


def delegated_main(name: str):
    """The ``main(argv)`` of a :data:`DELEGATED` subcommand. Imported here, on use, as the
    other subcommands' modules are: pandas, matplotlib and torch take seconds to import
    (``scalestudy plan`` starts in well under one)."""
    if name == "predict":
        from scalestudy.commands.predict import main
    elif name == "tune":
        from scalestudy.commands.tune import main
    elif name == "run-point":
        from scalestudy.run.runner import main
    elif name == "status":
        from scalestudy.commands.status import main
    elif name == "export":
        from scalestudy.commands.export import main
    else:
        from scalestudy.commands.compare import main
    return main


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; Ctrl-C ends any of them with one line and exit status 130."""
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print("scalestudy: interrupted; run the same command again to go on (a study reruns "
              "only its unfinished points)", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    # a full disk or an unwritable results folder: one line naming the path, exit status 2
    from scalestudy.record.io import exit_on_os_error

    if argv and argv[0] in DELEGATED:
        return exit_on_os_error(lambda: delegated_main(argv[0])(argv[1:]))
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # run: for snakemake
    args = build_parser().parse_args(argv[:len(argv) - len(extra) - bool(extra or "--" in argv)])
    args.snakemake_args = extra
    from scalestudy.record.reading import RecordError, printable
    from scalestudy.run.guard import StudyLocked

    try:
        return exit_on_os_error(lambda: args.func(args))
    except (StudyError, PointError, RecordError, StudyLocked) as e:
        one_line = printable(str(e).replace("\r", "\\r").replace("\n", "\\n"))
        print(f"scalestudy: error: {one_line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
