"""A full disk under one folder, for a test's subprocesses (test-only; production code has no
fault switch): with this folder on ``PYTHONPATH`` and ``SCALESTUDY_TEST_FULL_DISK=FOLDER`` in
the environment, every ``os.replace`` onto a file under FOLDER fails as a write on a full
disk does (``ENOSPC``, no file named), so an atomic write there never lands. A test uses it
where a real small file system (a tmpfs) cannot be mounted: a Snakemake run whose rules
write under FOLDER."""

import errno
import os

_FOLDER = os.environ.get("SCALESTUDY_TEST_FULL_DISK")

if _FOLDER:
    _replace = os.replace

    def _full_replace(src, dst, *args, **kwargs):
        if os.path.abspath(os.fspath(dst)).startswith(os.path.join(_FOLDER, "")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return _replace(src, dst, *args, **kwargs)

    os.replace = _full_replace
