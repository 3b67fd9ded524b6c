"""A converged comparison's work directory carried to the next machine in one archive of the checkout.

The machines the CPU queue runs on are lost between sessions, ``runs/`` with them, while one converged
row trains longer than a session (7-8 hours at ``small``). :func:`save` writes what the run needs to
resume into one archive, committed at the end of a session; :func:`restore` unpacks it into the empty
work directory of the next machine, where ``capsagg-table1`` resumes every row where it stood:

- its records (``stages.json``, ``config.json``, the queue's frozen commit), logs, translations and tables;
- the binarised data and the subword model; not the corpus, which the run rebuilds from ``../shared``
  in a second (its stage is dropped), nor the encoded training split (only binarising read it);
- of a row still training: its last checkpoint whole (the optimizer state too: it resumes as if never
  stopped), its best checkpoint, and the interval checkpoints that can still be among the last
  :data:`~.convergence.AVERAGED` it ends with (:func:`still_averaged`), these without optimizer state;
- of a row trained: its best checkpoint and its average, or, until it is averaged, its last interval
  checkpoints, without optimizer state.

    python -m fairseq_capsagg.pipeline.carry save runs/converged carry/converged.tar.xz
    python -m fairseq_capsagg.pipeline.carry restore carry/converged.tar.xz runs/converged
"""

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import convergence, stage_names

#: What the archive records besides the work directory's files.
MANIFEST = "carried.json"
#: Files of the work directory never carried: rebuilt, or only the live queue's.
LEFT_BEHIND = re.compile(r"^(corpus/.*|spm/train\..*|checkpoints/.*|queue\.pid|stages\.lock)$")


class CarryError(RuntimeError):
    """A work directory with nothing to carry, or one that a restore would overwrite."""


def still_averaged(intervals: Sequence[int], best_update: int, config: Dict[str, object],
                   continued: bool) -> List[int]:
    """The interval checkpoints (their updates) of a row still training that can be among the last
    :data:`~.convergence.AVERAGED` it stops with: those within that many intervals of the earliest update it
    can stop at (a continued row's fixed length; else :meth:`~.convergence.StopRule.target` of its best update,
    which only moves later)."""
    rule = convergence.StopRule.of(config)
    earliest_stop = config["warm_updates"] if continued else rule.target(best_update)
    return [u for u in intervals if u > earliest_stop - convergence.AVERAGED * rule.interval]


def _checkpoints(work: Path, stages: Dict[str, object], config: Dict[str, object], out: Path) -> Dict[str, str]:
    """Writes the checkpoints that :func:`save` carries (see the module) into ``out``; returns, per row still
    training whose best checkpoint is its last, ``row: "checkpoint_best.pt"`` (copied from the last on restore)."""
    best_is_last = {}
    for save_dir in sorted(p for p in (work / "checkpoints").glob("*") if p.is_dir()):
        row, dest = save_dir.name, out / "checkpoints" / save_dir.name
        dest.mkdir(parents=True)
        best, last = save_dir / "checkpoint_best.pt", save_dir / "checkpoint_last.pt"
        by_update = convergence.interval_checkpoints_by_update(save_dir)
        if stage_names.train(row) in stages:
            averaged = stage_names.average(row) in stages
            stripped = [best, *([save_dir / "checkpoint_average.pt"] if averaged else
                                list(by_update.values())[-convergence.AVERAGED:])]
        else:
            if not last.is_file():
                continue
            shutil.copy2(last, dest / last.name)
            best_update = convergence.checkpoint_updates(best)[0] if best.is_file() else 0
            if best_update == convergence.checkpoint_updates(last)[0]:
                best_is_last[row] = best.name
                best = None
            kept = still_averaged(list(by_update), best_update, config, row.startswith("continued-"))
            stripped = [best, *(by_update[u] for u in kept)]
        for path in stripped:
            if path is not None and path.is_file():
                convergence.copy_without_optimizer(path, dest / path.name)
    return best_is_last


def save(work: Path, archive: Path) -> Path:
    """Writes ``work``'s state into ``archive`` (xz-compressed tar, replaced; see the module).

    Raises:
        CarryError: ``work`` has no stage done.
    """
    if not (work / "stages.json").is_file():
        raise CarryError(f"{work}: no stages.json, nothing to carry")
    stages = json.loads((work / "stages.json").read_text())
    config = json.loads((work / "config.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "work"
        staged.mkdir()
        for path in sorted(work.rglob("*")):
            relative = path.relative_to(work).as_posix()
            if path.is_file() and not LEFT_BEHIND.match(relative):
                (staged / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, staged / relative)
        carried = {k: v for k, v in stages.items() if k != stage_names.CORPUS}
        (staged / "stages.json").write_text(json.dumps(carried, indent=2))
        best_is_last = _checkpoints(work, stages, config, staged)
        (staged / MANIFEST).write_text(json.dumps({"source": str(work.resolve()), "best_is_last": best_is_last},
                                                  indent=2))
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(archive.name + ".partial")
        with tarfile.open(partial, "w:xz", preset=1) as tar:
            tar.add(staged, arcname=".")
        partial.replace(archive)
    return archive


def restore(archive: Path, work: Path) -> Dict[str, object]:
    """Unpacks ``archive`` into ``work`` (see the module); returns its manifest.

    Raises:
        CarryError: ``work`` holds a run already (its stages.json), which the archive would overwrite.
    """
    if (work / "stages.json").exists():
        raise CarryError(f"{work} holds a run already (stages.json); restore into an empty work directory")
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    manifest = json.loads((work / MANIFEST).read_text())
    for row, name in manifest["best_is_last"].items():
        save_dir = work / "checkpoints" / row
        shutil.copy2(save_dir / "checkpoint_last.pt", save_dir / name)
    return manifest


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="carry", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="action", required=True)
    saving = sub.add_parser("save", help="a work directory's state into an archive")
    saving.add_argument("workdir", type=Path)
    saving.add_argument("archive", type=Path)
    restoring = sub.add_parser("restore", help="an archive into an empty work directory")
    restoring.add_argument("archive", type=Path)
    restoring.add_argument("workdir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.action == "save":
            save(args.workdir, args.archive)
            print(f"{args.archive}: {args.workdir} ({args.archive.stat().st_size / 2**20:.1f} MiB)")
        else:
            restore(args.archive, args.workdir)
            print(f"{args.workdir}: restored from {args.archive}")
    except CarryError as e:
        print(f"carry: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
