#!/usr/bin/env bash
# GPU benchmark: a ~1.1B-parameter GPT (seq 2048, bf16 autocast + fp32 master weights,
# fused AdamW, SDPA/flash attention) for 20 steps on one GPU, through the real pipeline path
# (point.json -> scalestudy.run.runner -> torchrun -> scalestudy.train), with activation
# checkpointing off and on, and torch.compile. Writes tokens/s, MFU vs the spec peak (H200-SXM:
# 989 TFLOP/s dense bf16) and vs the measured bf16 matmul ceiling, and peak memory.
#
#   scripts/gpu_bench.sh            # on the GPU host; results to $OUT (else results/bench)
#                                   # (runs `python -m benchmarks gpu` from the repository root)
#   scripts/gpu_bench.sh --smoke    # the same logic on the CPU with a tiny model
#   GPU_CONFIGS=eager,compile MICRO_BATCH=16 scripts/gpu_bench.sh
#
# Budget: < 5 minutes end to end on one H200 (each configuration has its own watchdog; the
# whole script is bounded by BENCH_TIMEOUT seconds, default 290).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${OUT:-results/bench}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

BUDGET="${BENCH_TIMEOUT:-290}"
args=(gpu --out "$OUT_DIR" --workdir "$OUT_DIR/work" --budget $(( BUDGET - 20 )))
if [[ "${1:-}" == "--smoke" ]]; then
  args+=(--smoke)
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
else
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' || {
    echo "gpu_bench: no CUDA device visible to $PY (use --smoke for the CPU path)" >&2; exit 3; }
  "$PY" -c 'import pandas, yaml' || {
    echo "gpu_bench: $PY lacks pandas/pyyaml (needed by scalestudy); install the project" >&2; exit 4; }
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv || true
fi
[[ -n "${GPU_CONFIGS:-}" ]] && args+=(--gpu-configs "$GPU_CONFIGS")
[[ -n "${MICRO_BATCH:-}" ]] && args+=(--micro-batch "$MICRO_BATCH")
[[ -n "${STEPS:-}" ]] && args+=(--steps "$STEPS")

mkdir -p "$OUT_DIR"
start=$(date +%s)
rc=0
# the benchmarks are a top-level package of the repository (cwd), not of scalestudy
timeout -k 10 "$BUDGET" "$PY" -m benchmarks "${args[@]}" || rc=$?
echo "gpu_bench: done in $(( $(date +%s) - start )) s -> $OUT_DIR/gpu.json, $OUT_DIR/figures.csv"
exit $rc
