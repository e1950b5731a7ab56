"""``python -m scalestudy.commands.host_slices``: the command line of :mod:`scalestudy.measure.host_slices`."""

from __future__ import annotations

import argparse
import json
import sys

from scalestudy.measure import host_slices as stage
from scalestudy.measure.host_slices import BLOCK_ROUNDS, SHARING_ROUNDS, measure_slice


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scalestudy.commands.host_slices",
                                description=stage.__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the slice's JSON record (written atomically)")
    p.add_argument("--blocks-json", default="[]",
                   help="a JSON list of blocks.block_spec entries: the study's model "
                        "pieces at each micro-batch and layout")
    p.add_argument("--core-sharing", nargs="*", type=int, default=[],
                   help="the study's process counts on the host (core sharing and "
                        "synchronisation wait)")
    p.add_argument("--block-rounds", type=int, default=BLOCK_ROUNDS)
    p.add_argument("--sharing-rounds", type=int, default=SHARING_ROUNDS)
    p.add_argument("--devices-per-node", type=int, default=1,
                   help="the study's devices per node: the slice runs with one device's share "
                        "of the host's threads, as each point's process does")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="a GPU study's host model is the preset's: nothing is timed there")
    args = p.parse_args(argv)
    import torch

    from scalestudy.measure.calibrate import process_threads
    from scalestudy.record.io import write_json
    from scalestudy.train.device import resolve_device_type

    specs, procs = json.loads(args.blocks_json), args.core_sharing
    if resolve_device_type(args.device) != "cpu":
        specs, procs = [], []
    torch.set_num_threads(process_threads(args.devices_per_node))
    rec = measure_slice(specs, procs, args.block_rounds, args.sharing_rounds)
    write_json(args.out, rec)
    print(f"host slice: {len(rec['blocks'])} block rows, {len(rec['core_sharing'])} core-sharing "
          f"rows (load {rec['load_1m']:.2f}) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
