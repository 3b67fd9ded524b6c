"""The converged comparison's Transformer while it still trains, frozen into a work directory of its own.

``converged-baseline-s1`` trains for hours before its stop rule ends it; the continued rows wait for it.
:func:`freeze` copies what it has saved so far (the data, the subword model, its best, last and interval
checkpoints, its logs) into another work directory and records its training there as ended at its last
checkpoint, marked ``snapshot`` and not converged, while the run itself goes on untouched. There
``capsagg-table1 --table converged --rows converged-baseline-s1`` scores it as it scores a converged row
(best checkpoint, the average of the last five interval checkpoints, ``--score-reference``), and
:mod:`.reference_pack` packs it for another machine. Its table says "(snapshot)" after its update count.

    python -m fairseq_capsagg.pipeline.snapshot runs/converged runs/converged-snapshot
    capsagg-table1 --table converged --workdir runs/converged-snapshot --rows converged-baseline-s1
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

from . import convergence, provenance, stage_names
from .converged import REFERENCE, mean_load, training_record

#: The frozen commit a queue trains with (examples/converged_queue.sh writes it into the work directory).
QUEUE_COMMIT = "queue.commit"


class SnapshotError(RuntimeError):
    """A work directory with nothing to freeze, or a destination that is not free."""


def _link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system
        shutil.copy2(source, dest)


def _link_tree(source: Path, dest: Path) -> None:
    """``source`` into ``dest``, hard-linked file by file (data that never changes once written)."""
    shutil.copytree(source, dest, copy_function=_link_or_copy)


def _trained_by(work: Path) -> Dict[str, str]:
    """The code and device the source run trains with: the queue's frozen commit where it has one."""
    trained_by = provenance.provenance(gpu=False)
    if (work / QUEUE_COMMIT).is_file():
        trained_by["code"] = (work / QUEUE_COMMIT).read_text().strip()
    return trained_by


def _check_freezable(work: Path, dest: Path, stages: Dict[str, object]) -> None:
    """Raises :class:`SnapshotError` unless ``work``'s Transformer is still training from finished data stages,
    with a best checkpoint, and ``dest`` is free."""
    if dest.exists():
        raise SnapshotError(f"{dest} exists; a snapshot goes into a new work directory")
    if stage_names.train(REFERENCE) in stages:
        raise SnapshotError(f"{work}: {REFERENCE} has finished training; score and pack {work} itself")
    missing = [name for name in stage_names.DATA_STAGES if name not in stages]
    if missing or not (work / "checkpoints" / REFERENCE / "checkpoint_best.pt").is_file():
        raise SnapshotError(f"{work}: {REFERENCE} has no checkpoint yet "
                            f"({', '.join(missing) + ' not done' if missing else 'no checkpoint_best.pt'})")


def _copy_checkpoints(source: Path, save_dir: Path) -> None:
    """The best, last and last interval checkpoints of ``source`` copied into ``save_dir``, each read back.

    Copies, not links: the run goes on replacing checkpoint_best.pt and checkpoint_last.pt and deleting old
    interval checkpoints while this copies them. Raises :class:`SnapshotError` for one it could not read.
    """
    save_dir.mkdir(parents=True)
    for path in (source / "checkpoint_best.pt", source / "checkpoint_last.pt",
                 *convergence.interval_checkpoints(source)[-convergence.AVERAGED:]):
        try:
            shutil.copy2(path, save_dir / path.name)
            convergence.checkpoint_updates(save_dir / path.name)
        except Exception as e:  # noqa: BLE001 (a file deleted meanwhile, or torch.load's errors on a partial one)
            raise SnapshotError(f"{path} could not be read ({type(e).__name__}): the run was saving; "
                                "try again (or pause the run first)") from None


def freeze(work: Path, dest: Path) -> Dict[str, object]:
    """Freezes ``work``'s ``converged-baseline-s1``, still training, into the new work directory ``dest``.

    Returns:
        the training record of the snapshot (as :meth:`.ConvergedTable.train` records a row, with
        ``converged`` false and ``snapshot`` true).

    Raises:
        SnapshotError: ``dest`` exists, ``work``'s Transformer has no checkpoint yet or has converged
        already (then pack ``work`` itself), or its data stages are not done.
    """
    stages = json.loads((work / "stages.json").read_text()) if (work / "stages.json").is_file() else {}
    _check_freezable(work, dest, stages)
    dest.mkdir(parents=True)
    shutil.copy2(work / "config.json", dest / "config.json")
    for name in ("corpus", "spm", "data-bin"):
        _link_tree(work / name, dest / name)
    save_dir = dest / "checkpoints" / REFERENCE
    try:
        _copy_checkpoints(work / "checkpoints" / REFERENCE, save_dir)
    except SnapshotError:
        shutil.rmtree(dest)
        raise
    log_dir = dest / "logs" / f"train-{REFERENCE}"
    shutil.copytree(work / "logs" / f"train-{REFERENCE}", log_dir)
    load_log = work / "logs" / "load.tsv"
    if load_log.is_file():
        shutil.copy2(load_log, dest / "logs" / load_log.name)
    lr = json.loads((work / "config.json").read_text())["lr"]
    record = {**training_record(convergence.on_disk(save_dir), log_dir, False, lr,
                                mean_load(load_log, 0, time.time()), _trained_by(work)),
              "snapshot": True}
    done = {name: stages[name] for name in stage_names.DATA_STAGES}
    done[stage_names.train(REFERENCE)] = record
    (dest / "stages.json").write_text(json.dumps(done, indent=2))
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="snapshot", description=__doc__.splitlines()[0])
    p.add_argument("workdir", type=Path, help="a converged comparison's work directory (runs/converged)")
    p.add_argument("dest", type=Path, help="the snapshot's work directory (new)")
    args = p.parse_args(argv)
    try:
        record = freeze(args.workdir, args.dest)
    except SnapshotError as e:
        print(f"snapshot: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.dest}: {REFERENCE} of {args.workdir} at update {record['stopped_at']} "
          f"(best {record['best_loss']:.3f} at {record['best_update']}); score it with capsagg-table1 --table "
          f"converged --workdir {args.dest} --rows {REFERENCE} (and {args.workdir}'s settings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
