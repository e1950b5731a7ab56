"""A rank's view of itself, for tests/unit/test_forked_ranks.py: ``python -u -m forked_probe
MODE``, forked by ``scalestudy.run.forked_ranks`` or exec'd. Prints one JSON line (its pid,
parent, session, argv, ``PROBE`` variable, open descriptors, signal handlers), writes a line
to stderr, then exits 3 (MODE ``exit``) or sleeps (MODE ``sleep``)."""

import json
import os
import signal
import sys
import time

print(json.dumps({
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "argv": sys.argv[1:],
    "name": __name__, "probe": os.environ.get("PROBE"),
    "fds": sorted(int(n) for n in os.listdir("/proc/self/fd")),
    "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "sigint_default": signal.getsignal(signal.SIGINT) is signal.default_int_handler}))
print("probe on stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(120)
sys.exit(3)
