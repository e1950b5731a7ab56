"""``scalestudy nodecheck``: the per-node probe of the node check (:mod:`scalestudy.measure.nodecheck`)."""

from __future__ import annotations

import json

NAME = "nodecheck"
SUMMARY = "time a matrix product on this node (the node check's probe)"
DESCRIPTION = ("Prints one JSON line, this node's name and the FLOP/s of one matrix product, "
               "which the node check of a multi-node point compares across its nodes.")
EXAMPLE = "scalestudy nodecheck --size 512"


def add_arguments(p) -> None:
    p.add_argument("--size", type=int, default=512, help="m = n = k of the product (default 512)")


def run(args) -> int:
    from scalestudy.measure.nodecheck import probe

    print(json.dumps(probe(args.size)), flush=True)
    return 0
