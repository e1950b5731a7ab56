#!/usr/bin/env bash
# Install scalestudy as a user does, into a fresh venv that borrows nothing: the CPU torch pin
# first (the order of docs/getting-started.md), then the package from this checkout with its
# declared dependencies resolved by pip. Used by tests/integration/test_install.py, and by .ci/run before the suite
# (so that pip's download and resolution is not timed with the tests).
#   scripts/fresh-install.sh VENV [CHECKOUT]
set -euo pipefail
venv=${1:?usage: scripts/fresh-install.sh VENV [CHECKOUT]}
checkout=${2:-$(cd "$(dirname "$0")/.." && pwd)}
unset PYTHONPATH PYTHONHOME
export PYTHONNOUSERSITE=1
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -m pip install -q "$checkout"
