"""``scalestudy fit``: the model's one fitted constant (:mod:`scalestudy.validation.fit`)."""

from __future__ import annotations

NAME = "fit"
SUMMARY = "fit the performance model's one constant on published tables"
DESCRIPTION = ("Fits the model's one fitted constant on the declared subset of the shipped "
               "published tables and prints each table's error in and out of sample "
               "(leave-one-table-out).")
EXAMPLE = "scalestudy fit --write"


def add_arguments(p) -> None:
    p.add_argument("--write", action="store_true", help="store the result in data/perf_fit.yaml")


def run(a) -> int:
    from scalestudy.validation.fit import CONSTANT, fit, write

    result = fit()
    c = result["constants"][CONSTANT]
    print(f"{CONSTANT} = {c['value']} (leave-one-table-out range {c['low']} - {c['high']}), "
          f"fitted on {', '.join(result['fit']['tables'])}; 1 fitted constant")
    print(f"{'table':32} {'in fit':>6} {'rows':>5} {'MAPE':>7} {'bias':>7} {'LOTO MAPE':>10} "
          f"{'LOTO bias':>10}")
    for t, r in result["fit"]["per_table"].items():
        print(f"{t:32} {'yes' if r['in_fit'] else 'no':>6} {r['rows']:>5} {r['mape']:>7.1%} "
              f"{r['bias']:>+7.1%} {r['loto_mape']:>10.1%} {r['loto_bias']:>+10.1%}")
    if a.write:
        print(f"-> {write(result)}")
    return 0
