#!/usr/bin/env bash
# The converged comparison's queue (capsagg-table1 --table converged), run in the background from a
# frozen copy of the code so that edits to the checkout cannot change a row while it trains.
#
#   examples/converged_queue.sh start [COMMIT]  # freeze COMMIT (default: the frozen copy in use, else HEAD)
#                                               # and start (or resume) every pending row, in order
#   examples/converged_queue.sh status          # the rows done and the last lines of the queue's log
#   examples/converged_queue.sh pause|resume    # SIGSTOP/SIGCONT the queue (to time something alone)
#   examples/converged_queue.sh stop            # end it; `start` resumes from its last checkpoints
#
# Everything lives under runs/ (ignored): runs/converged (the work directory, one process at a time),
# runs/queue-code-COMMIT (the frozen code), runs/converged/queue.log. The tables are published to
# docs/results/converged-cpu.{md,json} and converged-curves.png after every row. Extra arguments after
# COMMIT go to capsagg-table1 (e.g. --rows).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=$ROOT/runs
WORK=$RUNS/converged
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PIDFILE=$WORK/queue.pid

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

case "${1:-status}" in
  start)
    if running; then echo "the queue is running already (pid $(cat "$PIDFILE"))"; exit 0; fi
    current=$(cat "$WORK/queue.commit" 2>/dev/null || true)
    commit=$(git rev-parse --short "${2:-${current:-HEAD}}")
    shift $(( $# > 1 ? 2 : 1 ))
    code=$RUNS/queue-code-$commit
    if [[ ! -d $code ]]; then
      mkdir -p "$code.tmp" && git archive "$commit" | tar -x -C "$code.tmp" && mv "$code.tmp" "$code"
    fi
    mkdir -p "$WORK"
    echo "$commit" > "$WORK/queue.commit"
    echo "[queue] $(date -u +%FT%TZ) start from $code $*" >> "$WORK/queue.log"
    # PYTHONPATH puts the frozen package before the checkout's editable install; set -m gives the job its
    # own process group (pgid = pid), which pause/resume/stop signal with the trainings it starts
    (set -m; cd "$code" && PYTHONPATH=$code nohup "$PYTHON" -m fairseq_capsagg.pipeline.table1 --table converged \
      --workdir "$WORK" --publish "$ROOT/docs/results" "$@" >> "$WORK/queue.log" 2>&1 & echo $! > "$PIDFILE")
    echo "started (pid $(cat "$PIDFILE"), code $commit); log: $WORK/queue.log"
    ;;
  pause|resume)
    running || { echo "the queue is not running"; exit 1; }
    kill "-$([[ $1 == pause ]] && echo STOP || echo CONT)" -- "-$(cat "$PIDFILE")"
    echo "[queue] $(date -u +%FT%TZ) $1" >> "$WORK/queue.log"
    echo "$1d"
    ;;
  stop)
    running || { echo "the queue is not running"; exit 0; }
    kill -CONT -- "-$(cat "$PIDFILE")" 2>/dev/null || true
    kill -TERM -- "-$(cat "$PIDFILE")"
    echo "[queue] $(date -u +%FT%TZ) stop" >> "$WORK/queue.log"
    echo "stopped"
    ;;
  status)
    if running; then echo "running (pid $(cat "$PIDFILE"), code $(cat "$WORK/queue.commit"))"; else echo "not running"; fi
    [[ -f $WORK/stages.json ]] && "$PYTHON" -c "import json,sys; d=json.load(open(sys.argv[1])); \
print('\n'.join(k for k in d if k.startswith('train ')))" "$WORK/stages.json"
    [[ -f $WORK/queue.log ]] && grep -v '^    ' "$WORK/queue.log" | tail -n 5
    ;;
  *) echo "usage: $0 start [COMMIT] [table1 flags] | status | pause | resume | stop" >&2; exit 2 ;;
esac
