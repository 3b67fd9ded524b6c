#!/usr/bin/env bash
# What this project measures on a GPU machine without network, in one command under 8 minutes.
#
#   examples/gpu_check.sh wheels   # here, with network: the wheels the GPU image lacks, into .whl/ (ignored)
#   examples/gpu_check.sh          # there (carry .whl): installs them into /tmp/site, then
#                                  #   1. the CUDA tests (tests/unit/test_cuda.py: fused paths against eager ones,
#                                  #      bf16 training steps, incremental decoding of every family; and
#                                  #      tests/unit/kernels/: the Triton kernels themselves against their
#                                  #      references), at most 150 s;
#                                  #   2. the speed benchmark of every family in bf16 at `base` with 16,384-token
#                                  #      batches, two rounds, at most 300 s;
#                                  #   writing $OUT/speed-gpu-bf16.{md,json} and $OUT/gpu-check.log (OUT defaults
#                                  #   to docs/results).
#
# The image it is made for: Python 3.12 with torch (CUDA), sentencepiece, sacrebleu, matplotlib; fairseq and the
# rest of its dependencies come from the wheels. PYTHON picks the interpreter (default: the checkout's .venv
# where there is one, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
WHEELS_DIR=${WHEELS_DIR:-.whl}
OUT=${OUT:-docs/results}
WHEELS=(fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 subword-nmt==0.3.8
        mock==5.2.0 tensorboardX==2.6.5 pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0
        packaging==26.4)
SPEED=(--device cuda --shapes base --bf16 --tokens 16384 --length 64 --steps 10 --warmup 3 --decode-sentences 64
       --repeats 2 --name speed-gpu-bf16)

if [[ ${1:-} == wheels ]]; then
  mkdir -p "$WHEELS_DIR"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$WHEELS_DIR" "${WHEELS[@]}"
  "$PYTHON" -m pip wheel -q --no-deps -w "$WHEELS_DIR" antlr4-python3-runtime==4.9.3  # omegaconf's, an sdist only
  ls "$WHEELS_DIR"
  exit 0
fi

mkdir -p "$OUT"
check() {
  if compgen -G "$WHEELS_DIR/*.whl" > /dev/null; then
    [[ -d /tmp/site/fairseq ]] ||
      "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS_DIR"/*.whl
    export PYTHONPATH=/tmp/site:$PWD
  fi
  echo "[gpu-check] CUDA tests"
  timeout "${TEST_LIMIT:-150}" "$PYTHON" -m pytest -q -p no:cacheprovider tests/unit/test_cuda.py \
    tests/unit/kernels ||
    echo "[gpu-check] the CUDA tests failed or ran out of time (exit $?); the benchmark runs"
  echo "[gpu-check] speed, bf16, base"
  timeout "${SPEED_LIMIT:-300}" "$PYTHON" benchmarks/speed.py "${SPEED[@]}" --output-dir "$OUT" "$@" ||
    echo "[gpu-check] the benchmark failed or ran out of time (exit $?); its tables keep what it measured"
}
check "$@" 2>&1 | tee "$OUT/gpu-check.log"
