# Sourced by examples/converged_gpu.sh and examples/gpu_session.sh: the wheels in ${WHEELS_DIR:-.whl}
# (`converged_gpu.sh wheels`) installed once into /tmp/site and put on PYTHONPATH with this checkout, on a
# machine that lacks them.
WHEELS_DIR=${WHEELS_DIR:-.whl}
if [[ -d $WHEELS_DIR ]]; then
  [[ -d /tmp/site/fairseq ]] ||
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHEELS_DIR"/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
