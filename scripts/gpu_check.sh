#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): every GPU figure in one call of at most 9 minutes on
# one H100/H200, each part under its own watchdog, each finished part's JSON in $OUT before the
# next starts (a cut run keeps what it finished).
#
#   scripts/gpu_check.sh              # on the GPU host; JSON to $OUT (else results/gpu-check)
#   scripts/gpu_check.sh --smoke      # every part's same logic on the CPU with tiny models
#   scripts/gpu_check.sh --dry-run    # the schedule: each part's watchdog, their sum
#
# The device image lacks some of the pipeline's modules (jsonschema, HTA): `make gpu-wheels`
# downloads wheels for its Python into .gpu-wheels/ (carry that folder); part 0 installs from
# them without a network. BUDGET (s, default 540) bounds the whole call.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
[[ -d .gpu-wheels ]] && export GPU_WHEELS="${GPU_WHEELS:-$PWD/.gpu-wheels}"
args=(--out "${OUT:-results/gpu-check}" --budget "${BUDGET:-540}")
for a in "$@"; do
  case "$a" in
    --smoke) args+=(--smoke); export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ;;
    --dry-run) args+=(--dry-run) ;;
    *) echo "gpu_check: unknown option $a (--smoke, --dry-run)" >&2; exit 2 ;;
  esac
done
exec timeout -k 10 "$(( ${BUDGET:-540} + 30 ))" "$PY" -m benchmarks.gpu_check "${args[@]}"
