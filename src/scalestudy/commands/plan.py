"""``scalestudy plan``: the sweep of a study, one line a point."""

from __future__ import annotations

from pathlib import Path

NAME = "plan"
SUMMARY = "print the sweep: feasible and skipped points"
DESCRIPTION = ("Reads and checks the study file, derives every point (weak or strong scaling) "
               "and prints one line each, a skipped one with the reason.")
EXAMPLE = "scalestudy plan workflow/config/default.yaml --write"
VIEW = ["point_id", "mode", "n", "dp", "tp", "pp", "micro_batch", "grad_accum",
        "global_batch", "tokens_per_step", "feasible", "reason"]


def add_arguments(p) -> None:
    p.add_argument("study", help="study file (YAML)")
    p.add_argument("--write", action="store_true", help="also write RESULTS/<name>/plan.tsv")
    p.add_argument("--results", default="results", help="results root (default: results)")
    p.add_argument("--trust-site", action="store_true",
                   help="accept any site.env variable and more site options (see run)")


def load(path: str, trust_site: bool = False):
    """The study of ``path`` and its planned points."""
    from scalestudy.config.study import load_study
    from scalestudy.plan.planner import plan_points

    study = load_study(path, trust_site=trust_site)
    return study, plan_points(study, path)


def run(args) -> int:
    from scalestudy.plan.planner import plan_rows, write_plan

    study, points = load(args.study, args.trust_site)
    rows = plan_rows(points)
    if args.write:
        write_plan(points, Path(args.results) / study.name)
    table = [VIEW] + [["" if r[k] is None else str(r[k]) for k in VIEW] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(VIEW))]
    for row in table:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    n_ok = sum(p.feasible for p in points)
    print(f"\n{study.name}: {len(points)} runs planned, {n_ok} feasible, "
          f"{len(points) - n_ok} skipped")
    return 0
