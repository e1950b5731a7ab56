"""``scalestudy``: the study pipeline for people who don't want to type snakemake.

    scalestudy plan STUDY.yaml            print the sweep (feasible and skipped points)
    scalestudy run STUDY.yaml [-- ARGS]   validate, then run the Snakemake DAG (+ report.html)
        --trust-site                      let the site settings (study platform.site, profile
                                          site.yaml) set any environment variable and more
                                          srun/sbatch/torchrun options (README "Hostile input
                                          and security"); only for files you wrote yourself
    scalestudy aggregate RESULTS/STUDY    tables: runs.csv, efficiency.csv, summary.md, summary.tex
    scalestudy plot RESULTS/STUDY [--style single-column|double-column]   figures/
    scalestudy status [STUDY | RESULTS/STUDY] [--watch] [--json]   progress, failures, time left
    scalestudy compare RESULTS_A RESULTS_B [...] --out DIR          studies on one set of axes
    scalestudy predict | tune ...         performance model (see --help of each)

A bad study file ends with one line naming the field and the fix, exit status 2.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from scalestudy import paths
from scalestudy.config.point import PointError
from scalestudy.config.study import StudyError

# subcommands implemented by other modules' main(argv) (delegated_main)
DELEGATED = ("predict", "tune", "run-point", "status", "compare")
PLAN_VIEW = ["point_id", "mode", "n", "dp", "tp", "pp", "micro_batch", "grad_accum",
             "global_batch", "tokens_per_step", "feasible", "reason"]


def _load(path: str, trust_site: bool = False):
    from scalestudy.plan.planner import plan_points
    from scalestudy.config.study import load_study

    study = load_study(path, trust_site=trust_site)
    return study, plan_points(study, path)


def profile_site(profile: str | None) -> dict | None:
    """The ``site`` mapping a Snakemake profile brings (its ``configfile:`` files, as the
    shipped profiles do, and its ``config:``), or None."""
    import yaml

    if not profile:
        return None
    folder = Path(profile)
    try:
        conf = yaml.safe_load((folder / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    files = conf.get("configfile") or conf.get("configfiles") or []
    site: dict = {}
    for name in [files] if isinstance(files, str) else list(files):
        try:
            data = yaml.safe_load((folder / str(name)).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise StudyError(f"{folder / str(name)}: cannot read the profile's config file "
                             f"({type(e).__name__}); check the profile") from None
        if isinstance(data, dict) and isinstance(data.get("site"), dict):
            site.update(data["site"])
    config = conf.get("config")
    if isinstance(config, dict) and isinstance(config.get("site"), dict):
        site.update(config["site"])
    return site or None


def check_profile_site(study: dict, profile: str | None, trust_site: bool) -> None:
    """The site the Snakefile will run with (the study's, then the profile's), checked now so
    that a refused setting ends with one line before Snakemake starts."""
    from scalestudy.config.sitepolicy import SiteError, check_site
    from scalestudy.run.slurm import resolve_site

    layer = profile_site(profile)
    if not layer:
        return
    where = f"{Path(profile) / 'site'}"
    try:
        check_site(resolve_site(study["platform"]["site"], layer), trusted=trust_site,
                   where=where)
    except SiteError as e:
        raise StudyError(str(e)) from None
    except ValueError as e:  # resolve_site: an unknown key or a bad number
        raise StudyError(f"{where}: {e}") from None


def cmd_plan(args) -> int:
    from scalestudy.plan.planner import plan_rows, write_plan

    study, points = _load(args.study, args.trust_site)
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


def snakemake_argv(study: str, results: str, profile: str | None, extra: list[str],
                   trust_site: bool = False) -> list[str]:
    # Snakemake's metadata and locks live beside the results (one .snakemake per results root)
    Path(results).mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(paths.snakefile()),
            "--directory", str(Path(results).resolve())]
    if profile:
        argv += ["--profile", profile]
    argv += ["--config", f"study={Path(study).resolve()}", f"results={Path(results).resolve()}",
             *(["trust_site=true"] if trust_site else [])]
    return argv + extra


def cmd_run(args) -> int:
    study, _ = _load(args.study, args.trust_site)  # fail fast, before Snakemake starts anything
    extra = args.snakemake_args
    args.profile = args.profile or str(paths.profile("local"))
    check_profile_site(study, args.profile, args.trust_site)
    from scalestudy.run import guard

    study_dir = Path(args.results) / study["name"]
    guard.refuse_escaping_links(study_dir)  # (the Snakefile checks again, and takes the lock)
    if guard.is_locked(study_dir):
        raise guard.StudyLocked(f"study {study['name']} is being run by another launcher "
                                f"({guard.holder(study_dir / guard.LOCK_FILE)}); wait for it "
                                "to finish or stop it")
    argv = snakemake_argv(args.study, args.results, args.profile, extra, args.trust_site)
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
        rc = subprocess.call(snakemake_argv(args.study, args.results, args.profile, [],
                                            args.trust_site) + ["--report", str(report)])
    return rc


def cmd_aggregate(args) -> int:
    from scalestudy.report.summary import aggregate_study

    aggregate_study(Path(args.study_dir))
    return 0


def cmd_plot(args) -> int:
    from scalestudy.report import plots

    for path in plots.run(Path(args.study_dir), style=getattr(args, "style", None)):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="scalestudy", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan", help="print the sweep points of a study")
    p.add_argument("study")
    p.add_argument("--write", action="store_true", help="also write RESULTS/<name>/plan.tsv")
    p.add_argument("--results", default="results")
    p.add_argument("--trust-site", action="store_true",
                   help="accept any site.env variable and more site options (see run)")
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser("run", help="run a study through Snakemake")
    p.add_argument("study")
    p.add_argument("--results", default="results")
    p.add_argument("--profile", default=None,
                   help="Snakemake profile folder (default: the shipped workflow/profiles/local)")
    p.add_argument("--no-report", action="store_true", help="skip report.html")
    p.add_argument("--trust-site", action="store_true",
                   help="let the site settings (study platform.site, the profile's site.yaml) "
                   "set any environment variable (LD_PRELOAD, PYTHONPATH, ...) and any srun/sbatch "
                   "option, and torchrun's --log-dir/--logs-specs; only for files you wrote "
                   "(passed to Snakemake as --config trust_site=true)")
    p.set_defaults(func=cmd_run)
    for name, fn in (("aggregate", cmd_aggregate), ("plot", cmd_plot)):
        p = sub.add_parser(name, help=f"{name} the runs of RESULTS/<study>")
        p.add_argument("study_dir")
        p.set_defaults(func=fn)
        if name == "plot":
            from scalestudy.config.vocab import FigureStyle

            p.add_argument("--style", choices=[str(s) for s in FigureStyle], default=None,
                           help="figure width and fonts for a paper (default: the study's "
                                "report.figure_style)")
    for name in DELEGATED:
        sub.add_parser(name, add_help=False, help=f"see scalestudy {name} --help")
    return ap


def delegated_main(name: str):
    """The ``main(argv)`` of a :data:`DELEGATED` subcommand. Imported here, on use, as the
    other subcommands' modules are: pandas, matplotlib and torch take seconds to import
    (``scalestudy plan`` starts in well under one)."""
    if name == "predict":
        from scalestudy.report.predict import main
    elif name == "tune":
        from scalestudy.report.tune import main
    elif name == "run-point":
        from scalestudy.run.runner import main
    elif name == "status":
        from scalestudy.report.status import main
    else:
        from scalestudy.report.compare import main
    return main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return int(delegated_main(argv[0])(argv[1:]) or 0)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # run: for snakemake
    args = build_parser().parse_args(argv[:len(argv) - len(extra) - bool(extra or "--" in argv)])
    args.snakemake_args = extra
    from scalestudy.record.read import RecordError, printable
    from scalestudy.run.guard import StudyLocked

    try:
        return int(args.func(args) or 0)
    except (StudyError, PointError, RecordError, StudyLocked, FileNotFoundError) as e:
        one_line = printable(str(e).replace("\r", "\\r").replace("\n", "\\n"))
        print(f"scalestudy: error: {one_line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
