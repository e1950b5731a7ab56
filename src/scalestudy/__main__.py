"""``python -m scalestudy COMMAND ...``: the console command (``scalestudy.cli``)."""

import sys

from scalestudy.cli import main

sys.exit(main())
