# Sourced by examples/converged_gpu.sh and examples/gpu_session.sh: the wheels in .whl/ (`converged_gpu.sh
# wheels`) installed once into /tmp/site and put on PYTHONPATH with this checkout, on a machine that lacks them.
if [[ -d .whl ]]; then
  [[ -d /tmp/site/fairseq ]] ||
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
