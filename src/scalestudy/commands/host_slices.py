"""``scalestudy host-slices``: the command line of :mod:`scalestudy.measure.host_slices`."""

from __future__ import annotations

import json

from scalestudy.measure.host_slices import BLOCK_ROUNDS, SHARING_ROUNDS, measure_slice

NAME = "host-slices"
SUMMARY = "time the study's model blocks and core sharing on this host"
DESCRIPTION = ("Times the study's model pieces at each micro-batch and layout, and how much a process "
               "slows when the study's process counts share this host's cores (one JSON record).")
EXAMPLE = "scalestudy host-slices --device cpu --out host_slice.json"


def add_arguments(p) -> None:
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


def run(args) -> int:
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

