#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py), as the device tool runs it: two calls, each whole.
#
#   scripts/gpu_check.sh --call 1     # on the GPU host: probe, trainer MFU, memory (<= 240 s)
#   scripts/gpu_check.sh --call 2     # layouts' parity, energy, trace, step model (<= 360 s)
#   scripts/gpu_check.sh --call 1 --smoke   # the same call's logic on the CPU, tiny models
#   scripts/gpu_check.sh --rehearse   # both calls' smoke with the device's limits enforced
#   scripts/gpu_check.sh --dry-run    # the schedule
#
# Results go to $OUT (else results/gpu-check): at most 6 files directly under it per call.
# Before the call's clock starts, the wheels `make gpu-wheels` put in .gpu-wheels/ (carry that
# folder; the device has no network) are installed by name, each missing module only, under
# their own timeout (GPU_INSTALL_S, default 60) into a folder of their own on PYTHONPATH
# (GPU_SITE, default /tmp/scalestudy-gpu-site), never over the image's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
args=() smoke=0 mode=none
while [[ $# -gt 0 ]]; do
  case "$1" in
    --call) args+=(--call "${2:-}"); mode=call; shift ;;
    --smoke) args+=(--smoke); smoke=1 ;;
    --rehearse) args+=(--rehearse); mode=rehearse; smoke=1 ;;
    --dry-run) args+=(--dry-run); mode=dry ;;
    *) echo "gpu_check: unknown option $1 (--call 1|2, --smoke, --rehearse, --dry-run)" >&2
       exit 2 ;;
  esac
  shift
done
[[ $smoke == 1 ]] && export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ $smoke == 0 && $mode == call && -f .gpu-wheels/names.txt ]]; then
  site="${GPU_SITE:-/tmp/scalestudy-gpu-site}"
  # the carried names the image lacks (a name it has stays the image's)
  mapfile -t names < <("$PY" -m benchmarks.gpu_wheels missing .gpu-wheels/names.txt)
  state="nothing to install"
  if [[ ${#names[@]} -gt 0 ]]; then
    if timeout -k 5 "${GPU_INSTALL_S:-60}" "$PY" -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --find-links .gpu-wheels --target "$site" "${names[@]}"; then
      state="ok"
    else
      state="failed (exit $?)"
    fi
  fi
  export PYTHONPATH="$PYTHONPATH:$site" GPU_SITE="$site" GPU_CARRIED="${names[*]:-}" \
    GPU_CARRIED_STATE="$state"
  echo "gpu_check: carried ${names[*]:-nothing}: $state"
fi
# the calls bound themselves (benchmarks/gpu_check.py BUDGET: 240 s, 360 s on the device; 480 s
# each in the smoke run); this bounds the process from outside, 30 s beyond that
case "$mode:${args[*]}" in
  call:*--smoke*) bound=510 ;;
  call:*"--call 1"*) bound=270 ;;
  call:*) bound=390 ;;
  rehearse:*) bound=1000 ;;
  *) bound=60 ;;
esac
exec timeout -k 10 "$bound" "$PY" -m benchmarks.gpu_check --out "${OUT:-results/gpu-check}" \
  "${args[@]}"
