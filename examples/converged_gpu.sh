#!/usr/bin/env bash
# The converged comparison reduced to about 8 minutes of one GPU: the Transformer (`small`) trained to
# convergence with 4x larger batches, then the paper's protocol from its best checkpoint for EM routing,
# the dynamic combination and MUDD (and the Transformer continued), every row scored as on the CPU.
#
#   examples/converged_gpu.sh wheels        # here: the wheels the GPU machine lacks, into .whl/ (ignored)
#   examples/converged_gpu.sh run           # on the GPU machine (the device tool: carry .whl)
#   examples/converged_gpu.sh run --quick   # the same rows in minutes on a CPU (how it is tested)
#
# `run` installs .whl/ when it exists (into /tmp/site with pip --target: fairseq's tools then run as
# `python -m fairseq_cli.train` and so on, as their scripts are not beside the machine's Python), trains the rows in runs/converged-gpu (resumable) under
# `timeout ${LIMIT:-480}` seconds, and publishes the table to ${OUT:-docs/results}/converged-gpu.{md,json}
# and converged-curves-gpu.png after every row. Extra arguments go to capsagg-table1.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROWS=converged-baseline-s1,continued-baseline,continued-emrouting,continued-dyncomb,continued-mudd
# The GPU machine's Python (3.12) has torch, sentencepiece, sacrebleu, scipy, scikit-learn and matplotlib.
WHEELS=(fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 subword-nmt==0.3.8
        mock==5.2.0 tensorboardX==2.6.5)

case "${1:-}" in
  wheels)
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl "${WHEELS[@]}"
    "$PYTHON" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # omegaconf's, an sdist only
    ls .whl
    ;;
  run)
    shift
    source examples/gpu_wheels.sh
    device=(--gpu)
    if [[ " $* " == *" --quick "* ]]; then device=(); fi
    # 16,384 tokens per update (the CPU runs' 4,096 x 4); validation every 250 updates, patience 1,000, at
    # most 4,000; 500 further updates for the continued rows (about 2 epochs at this batch size)
    timeout "${LIMIT:-480}" "$PYTHON" -m fairseq_capsagg.pipeline.table1 --table converged "${device[@]}" \
      --workdir "${WORK:-runs/converged-gpu}" --systems baseline,emrouting,dyncomb,mudd --rows "$ROWS" \
      --max-tokens 16384 --warmup 100 \
      --validate-interval-updates 250 --patience-updates 1000 --update-cap 4000 --warm-updates 500 \
      --publish "${OUT:-docs/results}" "$@"
    ;;
  *) echo "usage: $0 wheels | run [--quick] [capsagg-table1 flags]" >&2; exit 2 ;;
esac
