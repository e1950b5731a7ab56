"""``scalestudy run``: a study through Snakemake, then its report."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from scalestudy.commands.plan import load

NAME = "run"
SUMMARY = "run a study through Snakemake (+ report.html)"
DESCRIPTION = ("Checks the study and the profile's site, then runs the Snakemake DAG: training "
               "points, tables, figures, then report.html. Arguments after -- go to Snakemake.")
EXAMPLE = "scalestudy run workflow/config/default.yaml -- --dry-run"
REST = "Snakemake's arguments"


def add_arguments(p) -> None:
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


def run(args) -> int:
    from scalestudy import paths
    from scalestudy.config.study_yaml import StudyError
    from scalestudy.run.snakemake import launch, report_env, run_snakemake, snakemake_argv

    study, _ = load(args.study, args.trust_site)  # fail fast, before Snakemake starts anything
    if not study.series:
        raise StudyError(f"{args.study}: series: the study has none to run; search its tune: "
                         f"layout with `scalestudy tune {args.study} --measure`")
    extra = args.rest
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
