"""``python -m scalestudy.train POINT_JSON RUN_DIR``: one rank of a point under torchrun, the
``train`` command (``scalestudy.commands.train``); the rank ends without the interpreter's
teardown once the command returned (the records written, the process group destroyed)."""

import sys

from scalestudy.commands import train
from scalestudy.commands.dispatch import run_command
from scalestudy.process_exit import exit_now

exit_now(run_command(train, sys.argv[1:]))
