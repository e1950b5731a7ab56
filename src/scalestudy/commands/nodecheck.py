"""``python -m scalestudy.commands.nodecheck``: the command line of :mod:`scalestudy.measure.nodecheck`."""

from __future__ import annotations

import argparse
import json
import sys

from scalestudy.measure.nodecheck import probe


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalestudy.commands.nodecheck",
                                 description="Time a matrix product on this node (one JSON line).")
    ap.add_argument("--size", type=int, default=512, help="m = n = k of the product (default 512)")
    args = ap.parse_args(argv)
    print(json.dumps(probe(args.size)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
