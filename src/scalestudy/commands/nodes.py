"""``scalestudy nodes``: a multi-node point's launchers (:mod:`scalestudy.run.nodes`)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

NAME = "nodes"
SUMMARY = "start a multi-node point's torchrun on each node (or emulate the nodes)"
DESCRIPTION = ("node runs inside each srun task of a Slurm allocation and replaces itself with "
               "its node's torchrun (the first node hosts the c10d rendezvous); local-nodes "
               "starts several torchrun launchers on this host; show prints the launch line "
               "and resources of a point.json. Arguments after -- are torchrun's script part.")
EXAMPLE = ("scalestudy nodes local-nodes --nnodes 2 --nproc-per-node 1 --rdzv-id x -- "
           "-m scalestudy.train RUN/point.json RUN")
REST = "torchrun's script part, e.g. -m scalestudy.train POINT_JSON RUN_DIR"


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node", help="start this node's torchrun (inside an srun task)")
    node.add_argument("--nnodes", type=int, required=True)
    node.add_argument("--nproc-per-node", type=int, required=True)
    node.add_argument("--rdzv-id", required=True)
    node.add_argument("--port", type=int, default=0,
                      help="fixed rendezvous port (site.rdzv_port); 0: the first node picks one")
    node.add_argument("--rdzv-dir", default=None,
                      help="the point's run folder on the shared filesystem (port file)")
    loc = sub.add_parser("local-nodes", help="emulate several nodes on this host (no Slurm)")
    loc.add_argument("--nnodes", type=int, required=True)
    loc.add_argument("--nproc-per-node", type=int, required=True)
    loc.add_argument("--rdzv-id", required=True)
    loc.add_argument("--port", type=int, default=0, help="0: a free port")
    show = sub.add_parser("show", help="print the launch line and resources of a point.json")
    show.add_argument("point_json")
    show.add_argument("run_dir", nargs="?")


def run(args) -> int:
    from scalestudy.run import nodes

    if args.cmd == "node":
        if not args.port and not args.rdzv_dir:
            raise SystemExit("scalestudy nodes node: give --rdzv-dir (the run folder, shared by "
                             "the nodes) or --port")
        return nodes.start_node(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                                rdzv_id=args.rdzv_id, port=args.port, rdzv_dir=args.rdzv_dir,
                                train=args.rest)
    if args.cmd == "local-nodes":
        return nodes.run_local_nodes(nnodes=args.nnodes, nproc_per_node=args.nproc_per_node,
                                     rdzv_id=args.rdzv_id, port=args.port, train=args.rest)
    return show(args.point_json, args.run_dir)


def show(point_json: str, run_dir: str | None) -> int:
    """Print the launch line, environment and resources of a point."""
    from scalestudy.config.point import Point
    from scalestudy.config.sitepolicy import SiteError, redact_environ
    from scalestudy.record.io import read_json
    from scalestudy.run.launch import launch_argv, launch_env
    from scalestudy.run.slurm import point_resources

    point = Point.from_json(read_json(point_json), point_json)
    folder = Path(run_dir or Path(point_json).parent)
    print("resources:", json.dumps(point_resources(point)))
    try:
        print("env:", json.dumps(redact_environ(launch_env(point))))
    except SiteError as e:
        print(f"env: not available here: {e}")
    print("argv:", shlex.join(launch_argv(point, folder)))
    return 0
