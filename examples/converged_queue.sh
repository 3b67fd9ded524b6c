#!/usr/bin/env bash
# The CPU queue of the long comparisons, run in the background from a frozen copy of the code so that
# edits to the checkout cannot change a row while it trains. Its jobs, in order (each resumable; a
# restarted queue skips what is done):
#
#   1. the converged comparison's row a (runs/converged): the Transformer to convergence;
#   2. the converged comparison's rows b that no run has scored yet, then those only the second run scored:
#      the paper's protocol from the Transformer's best checkpoint for the Transformer itself,
#      hyper-connections and mHC, then MUDD and DWA;
#   3. the protocol's noise: the Transformer's second seed continued (which every continued row is read
#      against) and the dynamic combination's (the one aggregator near a significant gain in the first run);
#   4. the rows b the first run published, trained again from this run's Transformer: linear and dynamic
#      combination, EM routing, EM routing on the encoder only (a continued row is only comparable with
#      the continued Transformer of its own converged Transformer);
#   5. the converged comparison's rows c and d: the dynamic combination, MUDD and EM routing from scratch to
#      convergence, the Transformer's second seed;
#   6. rows a-c for Zh->En (runs/converged-zhen, published as converged-zhen-cpu), the issue's "if time
#      remains after a-d";
#   7. the other peers from scratch (e), in the table's order;
#   8. every row left: the dynamic combination's second seed from scratch (10 hours for a second reading).
#
# Every job also scores its rows at their own length penalty tuned on the validation split (from 2026-12-02).
#
# Every run that lost its machine keeps the table it published; a continued row is only read against the
# continued Transformer of its own run, so each run publishes to a folder of its own. The first run
# (2026-11-27 and 11-28) lost its machine, and with it every checkpoint, after the rows of
# docs/results/converged-cpu.md; the second (docs/results/converged-run2/, 2026-11-28 and 11-29) after its
# Transformer, the continued Transformer, MUDD and DWA; this one is the third, published to
# docs/results/converged-run3/ (docs/results.md), begun again on 2026-12-02 after its machine was lost at
# update 25,500 of its Transformer, before it had published a row, and again at update 4,200; from 2026-12-02 each
# session carries its state to the next machine (carry, below). The peers table of DLCL, hyper-connections and mHC
# (docs/results/streams/) was the first run's job 2 and is complete.
#
#   examples/converged_queue.sh start [COMMIT]  # freeze COMMIT (default: the frozen copy in use, else HEAD)
#                                               # and start (or resume) the queue
#   examples/converged_queue.sh status          # the rows done, the rows training (update, validations, where and
#                                               # when they stop, how far from the earlier runs' same row) and the
#                                               # last lines of the queue's log
#   examples/converged_queue.sh jobs            # the jobs' capsagg-table1 arguments, one line each, in order
#   examples/converged_queue.sh pause|resume    # SIGSTOP/SIGCONT the queue (to time something alone)
#   examples/converged_queue.sh stop [--at-checkpoint]  # end it (after the next checkpoint: nothing lost);
#                                               # `start` resumes from the last checkpoints
#   examples/converged_queue.sh carry           # after the next checkpoint, the En->De work directory's state
#                                               # into carry/converged.tar.xz (commit it at the end of a session:
#                                               # the machines are lost between sessions, runs/ with them, while a
#                                               # converged row trains for longer than a session); `start` on a
#                                               # machine without runs/converged resumes from it
#   examples/converged_queue.sh restart [COMMIT]  # after the next checkpoint, stop and start again with COMMIT
#                                               # (default HEAD) frozen: how edits reach the queue
#
# Everything lives under runs/ (ignored): the work directories (one process at a time each),
# runs/queue-code-COMMIT (the frozen code), runs/converged/queue.log. The converged table is published to
# PUBLISHED (below) as converged-cpu.{md,json} and converged-curves.png after every row.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=$ROOT/runs
WORK=$RUNS/converged
PUBLISHED=$ROOT/docs/results/converged-run3  # the third run's tables (the earlier runs' stay where they are)
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
PIDFILE=$WORK/queue.pid
CARRIED=$ROOT/carry/converged.tar.xz  # the work directory's state from the last session (carry, below)

running() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

next_checkpoint() {  # waits for the next interval checkpoint of a row training under $1
  local marker
  marker=$(mktemp)
  echo "waiting for the next checkpoint under $1 ..."
  until [[ -n $(find "$1" -path '*/checkpoints/*' -name 'checkpoint_*_*.pt' -newer "$marker" -print -quit) ]]; do
    sleep 10
  done
  rm -f "$marker"
  sleep 20  # fairseq copies it to checkpoint_best.pt and checkpoint_last.pt after writing it
}

jobs_of() {  # one capsagg-table1 argument list per line, in the order the queue runs them
  local reference=converged-baseline-s1
  # every En->De job lists the same rows, the pending ones too, in the table it publishes
  # every row is also scored with the length penalty tuned on the validation split (Table 1's grid): at
  # convergence too the Transformer translates short (0.90 of the reference length in the first run)
  local tuned="--lenpen-grid 0.5,1,1.5,2,3"
  local converged="--table converged --second-seed baseline,dyncomb $tuned --workdir $WORK --publish $PUBLISHED"
  local paper_rows=continued-baseline,continued-linagg,continued-dyncomb,continued-emrouting
  local more_rows=continued-emrouting-encoder,continued-mudd,continued-dwa
  echo "$converged --rows $reference"
  echo "$converged --rows continued-baseline,continued-hc,continued-mhc,continued-mudd,continued-dwa"
  echo "$converged --rows continued-baseline-s2,continued-dyncomb-s2"
  echo "$converged --rows continued-linagg,continued-dyncomb,continued-emrouting,continued-emrouting-encoder"
  local from_scratch=converged-dyncomb-s1,converged-mudd-s1,converged-emrouting-s1
  echo "$converged --rows $from_scratch,converged-baseline-s2"
  echo "--table converged --source-lang zh --target-lang en $tuned --workdir $RUNS/converged-zhen" \
       "--publish $ROOT/docs/results --rows $reference,$paper_rows,$more_rows,$from_scratch"
  local peers=converged-dwa-s1,converged-depthattn-s1,converged-dlcl-s1,converged-hc-s1,converged-mhc-s1
  echo "$converged --rows $peers,converged-linagg-s1"
  echo "$converged"
}

case "${1:-status}" in
  start)
    if running; then echo "the queue is running already (pid $(cat "$PIDFILE"))"; exit 0; fi
    if [[ ! -x $PYTHON ]]; then echo "$PYTHON does not exist: run make setup first (or set PYTHON)" >&2; exit 2; fi
    if [[ ! -f $WORK/stages.json && -f $CARRIED ]]; then
      # a new machine: the run resumes from the state the last session carried (carry, below)
      mkdir -p "$WORK" && "$PYTHON" -m fairseq_capsagg.pipeline.carry restore "$CARRIED" "$WORK"
      echo "[queue] $(date -u +%FT%TZ) restored from $CARRIED" >> "$WORK/queue.log"
    fi
    if [[ ! -f $WORK/stages.json && -f $PUBLISHED/converged-cpu.json ]]; then
      echo "warning: $WORK has no stage done, yet $PUBLISHED holds scored rows: a new machine (runs/ lost)?" \
           "The queue trains from its first row again and will not publish over those rows (capsagg-table1's" \
           "--publish keeps a table's scored rows); to publish a new run, give its jobs another folder (PUBLISHED, above)." >&2
    fi
    current=$(cat "$WORK/queue.commit" 2>/dev/null || true)
    commit=$(git rev-parse --short "${2:-${current:-HEAD}}")
    code=$RUNS/queue-code-$commit
    if [[ ! -d $code ]]; then
      mkdir -p "$code.tmp" && git archive "$commit" | tar -x -C "$code.tmp" && mv "$code.tmp" "$code"
    fi
    mkdir -p "$WORK"
    echo "$commit" > "$WORK/queue.commit"
    echo "[queue] $(date -u +%FT%TZ) start from $code" >> "$WORK/queue.log"
    # PYTHONPATH puts the frozen package before the checkout's editable install, CAPSAGG_CODE_COMMIT names it in
    # every row's training record (a git archive has no history to read it from); set -m gives the queue its
    # own process group (pgid = pid), which pause/resume/stop signal with the trainings it starts. A job that
    # fails is logged and the next one runs, so the cores keep training until someone looks
    (set -m; cd "$code" && nohup bash -c '
      failed=0
      while IFS= read -r job; do
        echo "[queue] $(date -u +%FT%TZ) job: capsagg-table1 $job"
        eval "PYTHONPATH=$0 CAPSAGG_CODE_COMMIT=$2 $1 -m fairseq_capsagg.pipeline.table1 $job" || {
          rc=$?; failed=$((failed + 1))
          echo "[queue] $(date -u +%FT%TZ) job failed (exit $rc), the next one runs: capsagg-table1 $job"; }
      done
      echo "[queue] $(date -u +%FT%TZ) every job ran, $failed failed"' "$code" "$PYTHON" "$commit" < <(jobs_of) >> "$WORK/queue.log" 2>&1 &
      echo $! > "$PIDFILE")
    echo "started (pid $(cat "$PIDFILE"), code $commit); log: $WORK/queue.log"
    ;;
  pause|resume)
    running || { echo "the queue is not running"; exit 1; }
    kill "-$([[ $1 == pause ]] && echo STOP || echo CONT)" -- "-$(cat "$PIDFILE")"
    echo "[queue] $(date -u +%FT%TZ) $1" >> "$WORK/queue.log"
    echo "$1d"
    ;;
  stop|restart)
    if running && [[ $1 == restart || ${2:-} == --at-checkpoint ]]; then
      next_checkpoint "$RUNS"  # so that the stop loses no update
    fi
    if running; then
      kill -CONT -- "-$(cat "$PIDFILE")" 2>/dev/null || true
      kill -TERM -- "-$(cat "$PIDFILE")"
      echo "[queue] $(date -u +%FT%TZ) stop" >> "$WORK/queue.log"
      echo "stopped"
      sleep 5
    else
      echo "the queue is not running"
    fi
    if [[ $1 == restart ]]; then exec "$ROOT/examples/converged_queue.sh" start "${2:-HEAD}"; fi
    ;;
  carry)
    # the machines are lost between sessions, runs/ with them: the En->De work directory's state, written after
    # its next checkpoint into the checkout (commit it), from which `start` resumes on the next machine
    if running; then next_checkpoint "$WORK"; fi
    "$PYTHON" -m fairseq_capsagg.pipeline.carry save "$WORK" "$CARRIED"
    ;;
  jobs) jobs_of ;;
  status)
    if running; then echo "running (pid $(cat "$PIDFILE"), code $(cat "$WORK/queue.commit"))"; else echo "not running"; fi
    # each work directory's rows trained, and the rows training now: update, validations, where they stop; the
    # En->De rows' validations against every earlier run's table (the same network again, or how far from it)
    against=()
    for table in "$ROOT"/docs/results/converged-cpu.json "$ROOT"/docs/results/converged-run*/converged-cpu.json; do
      [[ -f $table && $table != "$PUBLISHED"/* ]] && against+=(--against "$table")
    done
    [[ -f $WORK/config.json ]] && "$PYTHON" -m fairseq_capsagg.pipeline.progress "$WORK" "${against[@]}"
    [[ -f $RUNS/converged-zhen/config.json ]] && "$PYTHON" -m fairseq_capsagg.pipeline.progress "$RUNS/converged-zhen"
    [[ -f $WORK/queue.log ]] && grep -v '^    ' "$WORK/queue.log" | tail -n 5
    ;;
  *) echo "usage: $0 start [COMMIT] | status | jobs | pause | resume | stop [--at-checkpoint] | restart [COMMIT] | carry" >&2
     exit 2 ;;
esac
