"""``python -m scalestudy.commands.fit``: the command line of :mod:`scalestudy.perf.fit`."""

from __future__ import annotations

import argparse
import sys

from scalestudy.perf import fit as stage
from scalestudy.perf.fit import CONSTANT, fit, write


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalestudy.commands.fit",
                                 description=stage.__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="store the result in data/perf_fit.yaml")
    a = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
