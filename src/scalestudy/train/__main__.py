"""``python -m scalestudy.train POINT_JSON RUN_DIR``: one rank of a point (under torchrun)."""

from scalestudy.train.loop import exit_now, main

exit_now(main())
