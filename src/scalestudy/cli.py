"""The ``scalestudy`` console command's registry: every subcommand, one module of
``scalestudy/commands/`` each (``commands.dispatch`` says what a command module holds).

``scalestudy --help`` lists them, one line each; ``scalestudy COMMAND --help`` says what one
does, with an example. The workflow's rules and the launch lines run the same commands
(``python -m scalestudy COMMAND``); a torchrun rank is ``python -m scalestudy.train``, whose
``__main__`` hands its arguments to the ``train`` command.
"""

from __future__ import annotations

import sys
from functools import partial

from scalestudy.commands import (aggregate, calibrate, compare, export, fit, front,
                                 host_slices, microbench, nodecheck, nodes, plan, plot, predict, run,
                                 run_point, status, torchrun, train, tune)
from scalestudy.commands.dispatch import command_line

DESCRIPTION = """Weak and strong scaling studies of distributed LLM training: plan a sweep, run it
through Snakemake, read the efficiency curves."""
EPILOG = """examples:
  scalestudy plan workflow/config/default.yaml     print the sweep
  scalestudy run workflow/config/default.yaml      run it; results in results/default/
  scalestudy status workflow/config/default.yaml   from another terminal: how far it is
  scalestudy COMMAND --help                        what COMMAND does, with an example

A bad study file ends with one line naming the field and the fix, exit status 2."""
#: the commands by group, as ``scalestudy --help`` lists them
GROUPS = {
    "study": (plan, run, status, aggregate, plot, compare, export, predict, tune),
    "workflow steps (what the Snakemake rules and launch lines run)":
        (run_point, nodes, torchrun, train, calibrate, host_slices, microbench, nodecheck,
         front, fit),
}
#: every command by name
COMMANDS = {c.NAME: c for group in GROUPS.values() for c in group}

#: ``scalestudy ARGS``: the console script (``python -m scalestudy``, ``python -m scalestudy.cli``)
main = partial(command_line, GROUPS, DESCRIPTION, EPILOG)

if __name__ == "__main__":
    sys.exit(main())
