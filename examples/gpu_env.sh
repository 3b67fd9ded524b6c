# Sourced by examples/converged_gpu.sh and examples/gpu_session.sh from the checkout's root: the Python they
# run and the packages the GPU machine lacks.
#
# PYTHON: the checkout's virtual environment here (make setup; this machine's system Python has no torch); on
# the GPU machine, which is never sent a .venv, its system Python (3.12, with torch, sentencepiece, sacrebleu,
# scipy, scikit-learn and matplotlib).
export PYTHON=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}

# The wheels in ${WHEELS_DIR:-.whl} (`converged_gpu.sh wheels`) installed once into /tmp/site and put on
# PYTHONPATH with this checkout, on a machine that lacks them.
use_wheels() {
  local wheels=${WHEELS_DIR:-.whl}
  [[ -d $wheels ]] || return 0
  [[ -d /tmp/site/fairseq ]] ||
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$wheels"/*.whl
  export PYTHONPATH=/tmp/site:$PWD
}
