"""``python -m scalestudy.train POINT_JSON RUN_DIR``: one rank of a point (under torchrun)."""

from scalestudy.process_exit import exit_now
from scalestudy.train.loop import main

exit_now(main())  # (after ``run`` returned: the records written, the process group destroyed)
