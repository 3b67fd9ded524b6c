#!/usr/bin/env bash
# Everything this project measures on a lent GPU, in one call of the device tool (at most 9 minutes,
# each step under its own time limit): first the speed and peak memory of the aggregators against the
# Transformer at `base` (benchmarks/speed.py, one round), then the reduced converged comparison
# (examples/converged_gpu.sh run). A step that fails or runs out of time is said, and the next runs.
#
#   examples/converged_gpu.sh wheels   # here, before: the wheels the GPU machine lacks, into .whl/
#   examples/gpu_session.sh            # on the GPU machine (the device tool: carry .whl; it sets OUT)
#   examples/gpu_session.sh --cpu      # the same steps reduced to seconds on a CPU (how it is tested)
#
# Writes $OUT/speed-gpu/speed.{md,json}, $OUT/converged-gpu.{md,json} with converged-curves-gpu.png, and
# its log, $OUT/gpu-session.log (OUT defaults to docs/results).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT=${OUT:-docs/results} PYTHON=${PYTHON:-python3} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
session() {
  SYSTEMS=(baseline linagg dyncomb emrouting dwa mudd dlcl hc mhc)
  source examples/gpu_wheels.sh
  if [[ ${1:-} == --cpu ]]; then
    speed=(--device cpu --shapes small --systems baseline mhc --steps 1 --warmup 1 --tokens 128 --length 8
           --decode-sentences 2 --vocab 500)
    converged=(--quick --report-only)
  else
    speed=(--device cuda --shapes base --systems "${SYSTEMS[@]}")
    converged=()
  fi

  timeout "${SPEED_LIMIT:-150}" "$PYTHON" benchmarks/speed.py "${speed[@]}" --output-dir "$OUT/speed-gpu" ||
    echo "[gpu-session] the speed benchmark failed or ran out of time (exit $?); the converged comparison runs"
  LIMIT=${LIMIT:-390} bash examples/converged_gpu.sh run "${converged[@]}"
}

# the whole log comes back with the tables (the device returns what is under $OUT), even after a time limit
session "$@" 2>&1 | tee "$OUT/gpu-session.log"
