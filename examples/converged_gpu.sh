#!/usr/bin/env bash
# The paper's protocol on one GPU: EM routing, the dynamic combination and MUDD (and the Transformer
# continued) trained on from the Transformer that the CPU queue trained to convergence, with 4x larger
# batches, every row scored as on the CPU. Measured on an H200 (2026-11-28): 40 s for the import and the
# step-0 losses, then about 3 minutes a row (500 updates in 100 s, its three decodings of the test split in
# 85 s), so `LIMIT=480` scores two continued rows; ROWS=... (capsagg-table1 --rows) picks the rows of a run.
#
#   examples/converged_gpu.sh wheels        # here: the wheels the GPU machine lacks, into .whl/ (ignored)
#   examples/converged_gpu.sh pack [WORK]   # here: the converged Transformer of WORK (runs/converged) into
#                                           #   .gpu-reference/ (ignored, about 20 MB)
#   examples/converged_gpu.sh snapshot [WORK] [flags]  # here, before WORK's Transformer has converged: its
#                                           #   best checkpoint so far frozen into runs/converged-snapshot, scored
#                                           #   there (capsagg-table1 with WORK's flags) and packed; marked
#                                           #   "(snapshot)" in every table
#   examples/converged_gpu.sh packed        # whether a pack is there (exit status)
#   examples/converged_gpu.sh run           # on the GPU machine (the device tool: carry .whl and .gpu-reference)
#   examples/converged_gpu.sh run --quick   # the same rows in minutes on a CPU (how it is tested)
#
# Why a pack: the Transformer itself does not converge within a lent GPU's session. Measured on an H200
# (2026-11-27): 16,384 tokens per update train at about 8 updates/s (a model this small leaves the GPU
# waiting on Python), and 2,200 updates reached validation loss 5.90, where the CPU run at 4,096 tokens
# per update was at 4.98 after 8,500 and still improving. Without .gpu-reference `run` trains the
# Transformer on the GPU first (a GPU without a time limit).
#
# `run` installs .whl/ when it exists (examples/gpu_env.sh), trains the rows in runs/converged-gpu
# (resumable) under `timeout ${LIMIT:-480}` seconds, and publishes the table to
# ${OUT:-docs/results}/converged-gpu.{md,json} and converged-curves-gpu.png after every row. Extra
# arguments go to capsagg-table1.
set -euo pipefail
cd "$(dirname "$0")/.."
source examples/gpu_env.sh  # PYTHON, use_wheels
PACK=${PACK:-.gpu-reference}
ROWS=${ROWS:-converged-baseline-s1,continued-baseline,continued-emrouting,continued-dyncomb,continued-mudd}
# what the GPU machine's Python lacks (examples/gpu_env.sh)
WHEELS=(fairseq-fixed==0.12.3.1 hydra-core==1.3.2 omegaconf==2.3.0 bitarray==3.12.3 subword-nmt==0.3.8
        mock==5.2.0 tensorboardX==2.6.5)

packed() { [[ -f $PACK/reference.json ]]; }

case "${1:-}" in
  wheels)
    mkdir -p .whl
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform any -d .whl "${WHEELS[@]}"
    "$PYTHON" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # omegaconf's, an sdist only
    ls .whl
    ;;
  pack)
    "$PYTHON" -m fairseq_capsagg.pipeline.reference_pack "${2:-runs/converged}" "$PACK"
    ;;
  snapshot)
    work=${2:-runs/converged} snapshot=${SNAPSHOT:-runs/converged-snapshot}
    shift $(($# < 2 ? $# : 2))
    "$PYTHON" -m fairseq_capsagg.pipeline.snapshot "$work" "$snapshot"
    # the rows `run` continues on the GPU: their step-0 losses only
    "$PYTHON" -m fairseq_capsagg.pipeline.table1 --table converged --workdir "$snapshot" \
      --systems baseline,emrouting,dyncomb,mudd --rows converged-baseline-s1 "$@" > "$snapshot/score.log"
    "$PYTHON" -m fairseq_capsagg.pipeline.reference_pack "$snapshot" "$PACK"
    ;;
  packed)  # exit status 0 when a pack is there for `run`
    packed
    ;;
  run)
    shift
    use_wheels
    device=(--gpu)
    if [[ " $* " == *" --quick "* ]]; then device=(); fi
    reference=()
    if packed; then reference=(--reference-from "$PACK"); fi
    # 16,384 tokens per update (the CPU runs' 4,096 x 4); validation every 250 updates; the continued rows
    # 500 further updates (2 epochs at this batch size); without a pack the Transformer first, patience
    # 1,000 updates, at most 4,000
    timeout "${LIMIT:-480}" "$PYTHON" -m fairseq_capsagg.pipeline.table1 --table converged "${device[@]}" \
      --workdir "${WORK:-runs/converged-gpu}" --systems baseline,emrouting,dyncomb,mudd --rows "$ROWS" \
      --max-tokens 16384 --warmup 100 "${reference[@]}" \
      --validate-interval-updates 250 --patience-updates 1000 --update-cap 4000 --warm-updates 500 \
      --publish "${OUT:-docs/results}" "$@"
    ;;
  *) echo "usage: $0 wheels | pack [WORKDIR] | snapshot [WORKDIR] [capsagg-table1 flags] | packed |" \
          "run [--quick] [capsagg-table1 flags]" >&2; exit 2 ;;
esac
