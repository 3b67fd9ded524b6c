"""The progress of a ``capsagg-table1`` work directory (any ``--table``): the rows trained, and each row in
training read from its fairseq logs; what ``examples/converged_queue.sh status`` prints for each work directory
(``python -m fairseq_capsagg.pipeline.progress WORKDIR``)."""

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from . import stage_names
from .by_method import RESULTS
from .convergence import StopRule, train_stretches, validation_curve
from .converged import SECOND_SEED, converged_rows, segment_logs
from .fairseq_runs import systems
from .replication import curve_gaps

_MAX_UPDATE = re.compile(r"'max_update': (\d+)")
#: How many of the last logged stretches the speed is the median of.
RECENT = 5


def trained(workdir: Path) -> List[str]:
    """The rows of ``workdir`` whose training has finished, in the order they finished."""
    done = json.loads((workdir / "stages.json").read_text()) if (workdir / "stages.json").exists() else {}
    return stage_names.trained_rows(done)


def stop_clause(config: dict, name: str, logs: Sequence[Path], curve: Sequence[dict], update: int,
                ups: float) -> str:
    """When the row ``name`` stops: in a work directory of the converged comparison a row from scratch by its
    rule (the time to its cap said too), a continued row after ``--warm-updates``; in one of the other tables at
    its ``--max-update``."""
    unless = ""
    if "validate_interval_updates" not in config:
        target = int(_MAX_UPDATE.search(logs[-1].read_text(encoding="utf-8", errors="replace")).group(1))
    elif name in {row.name for row in converged_rows(systems(), SECOND_SEED) if row.protocol == "continued"}:
        target = config["warm_updates"]
    else:
        rule = StopRule.of(config)
        best = min(curve, key=lambda point: point["loss"], default={"update": 0})
        target = rule.target(best["update"])
        cap_in = duration(rule.cap - update, ups)
        unless = f" unless a later validation is better (cap {rule.cap}{cap_in and ', in ' + cap_in})"
    return f"stops at {target}{time_left(target - update, ups)}{unless}"


def table_label(path: Path) -> str:
    """A published table as a line names it: relative to docs/results (``converged-run2/converged-cpu.json``),
    else its file name."""
    path = path.resolve()
    return str(path.relative_to(RESULTS)) if path.is_relative_to(RESULTS) else path.name


def progress(workdir: Path, done: Sequence[str], against: Sequence[Path] = ()) -> List[str]:
    """One line for each row of ``workdir`` that has started training and is not ``done``: its last logged
    update and speed, its validations, and the earliest update at which it stops (:func:`stop_clause`). With
    ``against`` (published tables' JSONs), how far each row's validations are from the same row's in each
    (:func:`against_published`)."""
    config = json.loads((workdir / "config.json").read_text())
    published = [(table_label(path), json.loads(path.read_text())["results"]) for path in against]
    lines = []
    for log_path in sorted((workdir / "logs").glob("train-*"), key=lambda p: p.stat().st_mtime):
        name = log_path.name[len("train-"):].removesuffix(".log")
        logs = segment_logs(log_path) if log_path.is_dir() else [log_path]
        if name in done or not logs:
            continue
        stretches, curve = train_stretches(logs), validation_curve(logs)
        update = int(stretches[-1]["num_updates"]) if stretches else 0
        ups = recent_speed(stretches)
        speed = f" ({ups:.2f} updates/s lately)" if stretches else ""
        validations = ", ".join(f"{point['loss']:.3f} at {point['update']}" for point in curve) or "none yet"
        compared = "".join(against_published(results[name], curve, label)
                           for label, results in published if name in results)
        lines.append(f"{name}: update {update}{speed}; validation loss {validations}; "
                     f"{stop_clause(config, name, logs, curve, update, ups)}{compared}")
    return lines


def against_published(result: dict, curve: Sequence[dict], label: str) -> str:
    """``; against converged-cpu.json: the same at all 2 validations`` (to the 3 decimals fairseq logs), or the
    largest gap and its update: whether a row trained again (on another machine, say) is still the published
    network."""
    gaps = curve_gaps(result, {"curve": curve})
    if not gaps:
        return ""
    gap, update = max(gaps)
    if gap == 0:
        return f"; against {label}: the same at all {len(gaps)} validations"
    return f"; against {label}: largest gap {gap:.3f} at {update} ({len(gaps)} validations)"


def recent_speed(stretches: Sequence[dict]) -> float:
    """Updates per second lately: the median of the last :data:`RECENT` logged stretches, so that one stretch
    that shared the cores (tests, a pause of the queue) does not swing the time estimates; 0 without any."""
    return statistics.median(s["ups"] for s in stretches[-RECENT:]) if stretches else 0.0


def duration(updates: int, updates_per_s: float) -> str:
    """``about 25 min`` or ``about 2.5 h``: ``updates`` at ``updates_per_s``; empty without a speed."""
    if updates_per_s <= 0 or updates <= 0:
        return ""
    minutes = updates / updates_per_s / 60
    return f"about {minutes:.0f} min" if minutes < 90 else f"about {minutes / 60:.1f} h"


def time_left(updates: int, updates_per_s: float) -> str:
    """`` (in about 25 min)``, or empty without a speed (:func:`duration`)."""
    left = duration(updates, updates_per_s)
    return f" (in {left})" if left else ""


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_capsagg.pipeline.progress",
        description="the progress of the rows in training of a capsagg-table1 work directory")
    parser.add_argument("workdir", type=Path, help="a work directory of capsagg-table1 (any --table)")
    parser.add_argument("--against", type=Path, metavar="TABLE.json", action="append", default=[],
                        help="a published table of the same rows (e.g. docs/results/converged-cpu.json; once per "
                             "table): say how far each row in training is from its validation losses there")
    args = parser.parse_args(argv)
    if not (args.workdir / "config.json").is_file():
        parser.error(f"{args.workdir} is not a work directory of capsagg-table1 (no config.json)")
    for table in args.against:
        if not table.is_file():
            parser.error(f"--against: {table} does not exist")
    done = trained(args.workdir)
    try:
        print(f"{args.workdir}: rows trained: {', '.join(done) or 'none yet'}")
        for line in progress(args.workdir, done, args.against):
            print(line)
        sys.stdout.flush()
    except BrokenPipeError:  # its reader stopped early (`status | head`): what it read stands, and no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the flush at exit fails no more
        os.close(devnull)
    return 0


if __name__ == "__main__":
    sys.exit(main())
