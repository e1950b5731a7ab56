"""``scalestudy torchrun``: torchrun with its c10d stores listening on the rendezvous address
only (:mod:`scalestudy.run.torchrun`)."""

from __future__ import annotations

import sys

NAME = "torchrun"
SUMMARY = "torchrun, its rendezvous stores bound to the rendezvous address"
DESCRIPTION = ("Runs torch.distributed.run with every argument after -- unchanged, its two "
               "TCP stores listening on the address they are given (not on every interface) "
               "and each rank dying with it. Ends without the interpreter's teardown once "
               "torchrun returned.")
EXAMPLE = ("scalestudy torchrun -- --nnodes 1 --nproc-per-node 2 -m scalestudy.train "
           "RUN/point.json RUN")
REST = "torchrun's own arguments"
#: a failed launch ends with torchrun's own error and exit code, as the runner expects
TRACEBACK = True


def add_arguments(p) -> None:
    pass


def run(args) -> int:
    from scalestudy.process_exit import exit_now
    from scalestudy.run import forked_ranks
    from scalestudy.run.torchrun import install, install_rank_lifetime
    from scalestudy.train.preload import preload

    # the zygote is forked here, before torchrun starts a thread
    zygote = forked_ranks.start(preload) if forked_ranks.serves(args.rest) else None
    if not install_rank_lifetime(zygote):
        print("scalestudy torchrun: warning: this torch has no SubprocessHandler._popen: "
              "a rank may outlive a killed torchrun", file=sys.stderr, flush=True)
    missing = install()
    if missing:
        print(f"scalestudy torchrun: warning: this torch has no {', '.join(missing)}: the "
              "rendezvous store listens on every interface", file=sys.stderr, flush=True)
    from torch.distributed.run import main as torchrun_main

    torchrun_main(args.rest)
    # torchrun returned once its ranks ended (a failed launch raises before: torchrun's own
    # error and exit code): end now, without tearing torch's modules down
    exit_now(0)
    return 0
