"""The converged comparison (``capsagg-table1 --table converged``): does an aggregator still help
once the Transformer has converged?

Rows, in the order they train, so that partial results are already useful:

a. ``converged-baseline-s1``: the Transformer from scratch until :class:`~.convergence.StopRule`
   stops it (no better validation loss for ``--patience-updates``, or ``--update-cap``).
b. The paper's protocol from that row's best checkpoint: ``continued-baseline`` (the Transformer
   trained on), then every aggregator of :data:`CONTINUED` (EM routing also on the encoder only),
   each ``--warm-updates`` further updates with the same schedule: a fresh optimizer, a linear
   warm-up over ``--warmup`` updates to the learning rate the Transformer had reached at its best
   checkpoint, then that rate. The routing families start as the Transformer and ramp in. Then the
   continued rows of the second seeds (``continued-baseline-s2`` by default: the noise of this protocol,
   an hour, which the differences of b. are read against; an aggregator's second seed against the
   Transformer's, :func:`second_seed_reference`).
c. :data:`FIRST_FROM_SCRATCH` from scratch to convergence.
d. The second seeds from scratch (the Transformer's by default: the noise of a converged row).
e. Every other system from scratch to convergence.

Every row is scored with its best checkpoint and with the average of its last five interval
checkpoints, its references scored by the model (``--score-reference``) to tell model errors from
search errors; rows from scratch also report when they first reach the converged Transformer's
best validation loss (compute equivalence; :mod:`.converged_report` writes the tables). A row is trained
in segments (:func:`~.convergence.train_in_segments`), so a stopped run resumes where it was stopped.
"""

import argparse
import os
import statistics
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Set

from .. import convergence, fairseq_runs, provenance, stage_names, train_logs
from ..experiment import Stages
from ..rows import (CONTINUED_REFERENCE, CONVERGED_REFERENCE, Decoding, Row, compare, hypothesis_file, score_row,
                    tune_row)
from ..warm_starts import step0_losses

#: Aggregators continued from the converged Transformer (the paper's protocol), in this order: the paper's
#: then the peers that start exactly as the Transformer (not DLCL, which starts as its uniform average).
CONTINUED = ("linagg", "dyncomb", "emrouting", "mudd", "dwa", "hc", "mhc")
#: Aggregators trained to convergence from scratch right after the paper's protocol.
FIRST_FROM_SCRATCH = ("dyncomb", "mudd", "emrouting")
#: The paper's Table 5 ablation: routing on the encoder only.
ENCODER_ONLY = ("--decoder-aggregation", "none")
REFERENCE = CONVERGED_REFERENCE
#: Second seeds by default: the Transformer's.
SECOND_SEED = ("baseline",)


def default_systems() -> List[str]:
    """The Transformer, the paper's combinations and EM routing, and every dense-connection peer."""
    return ["baseline", "linagg", "dyncomb", "emrouting", *fairseq_runs.peer_systems()]


def second_seed_reference(system: str, protocol: str, second_seed: Sequence[str]) -> str:
    """What a second-seed row of ``protocol`` is compared with: the Transformer's first seed for the Transformer
    (the noise); for an aggregator the Transformer of its own seed where that row exists (fairseq reseeds every
    update with seed + update, so same-seed rows see the same batches and dropout draws: a paired difference)."""
    if system == "baseline" or "baseline" not in second_seed:
        return CONTINUED_REFERENCE if protocol == "continued" else REFERENCE
    return f"{protocol}-baseline-s2"


def converged_rows(systems: Sequence[str], second_seed: Sequence[str]) -> List[Row]:
    """Every row, in the order they train (the module's a-e)."""
    rows = [Row(REFERENCE, "baseline", "converged", 1, REFERENCE),
            Row(CONTINUED_REFERENCE, "baseline", "continued", 1, REFERENCE)]
    for system in (s for s in CONTINUED if s in systems):
        rows.append(Row(f"continued-{system}", system, "continued", 1, CONTINUED_REFERENCE))
        if system == "emrouting":
            rows.append(Row("continued-emrouting-encoder", system, "continued", 1, CONTINUED_REFERENCE, ENCODER_ONLY))
    rows += [Row(f"continued-{s}-s2", s, "continued", 2, second_seed_reference(s, "continued", second_seed))
             for s in second_seed if s == "baseline" or s in CONTINUED]
    first = [s for s in FIRST_FROM_SCRATCH if s in systems]
    rows += [Row(f"converged-{s}-s1", s, "converged", 1, REFERENCE) for s in first]
    rows += [Row(f"converged-{s}-s2", s, "converged", 2, second_seed_reference(s, "converged", second_seed))
             for s in second_seed]
    peers = fairseq_runs.peer_systems()
    rest = sorted((s for s in systems if s != "baseline" and s not in first), key=lambda s: s not in peers)
    rows += [Row(f"converged-{s}-s1", s, "converged", 1, REFERENCE) for s in rest]
    return rows


class LoadSampler:
    """Appends the 1-minute load average to ``path`` every ``every`` seconds while training runs,
    so each row can say whether the cores were shared (2.0 is one training alone on two cores)."""

    def __init__(self, path: Path, every: float = 60.0):
        self.path, self.every = path, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while not self._stop.is_set():
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"{time.time():.0f}\t{os.getloadavg()[0]:.2f}\n")
            self._stop.wait(self.every)

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def mean_load(path: Path, start: float, end: float) -> Optional[float]:
    """The mean of the load samples in ``path`` between ``start`` and ``end`` (seconds since the epoch);
    None without any (a row shorter than the sampling interval)."""
    if not path.is_file():
        return None
    samples = [float(load) for stamp, load in (line.split("\t") for line in path.read_text().splitlines())
               if start <= float(stamp) <= end]
    return round(statistics.fmean(samples), 2) if samples else None


def segment_logs(log_dir: Path) -> List[Path]:
    """A row's ``fairseq-train`` logs (``from-UPDATE.log``, one per segment) in the order they ran."""
    return sorted(log_dir.glob("from-*.log"), key=lambda p: int(p.stem.split("-")[1]))


def training_record(progress: Dict[str, object], log_dir: Path, converged: bool, lr: float,
                    load_average: Optional[float], trained_by: Dict[str, str]) -> Dict[str, object]:
    """What a row's training measured, as its stage records it: ``progress``
    (:func:`~.convergence.on_disk`), whether the stop rule ended it, its learning rate, its idle speed,
    gradient norm and share of clipped updates from its logs in ``log_dir``, the mean load while it trained
    (the load now without samples) and ``trained_by`` (:func:`~.provenance.provenance`)."""
    stretches = train_logs.train_stretches(segment_logs(log_dir))
    return {**progress, "converged": converged, "lr": lr,
            "idle_updates_per_s": convergence.idle_speed([s["ups"] for s in stretches]),
            "grad_norm": statistics.fmean(s["gnorm"] for s in stretches),
            "clip_percent": statistics.fmean(s["clip"] for s in stretches),
            "load_average": load_average or round(os.getloadavg()[0], 2), **trained_by}


class ConvergedTable:
    """Trains, scores and reports the rows of the converged comparison in ``args.workdir``."""

    def __init__(self, args: argparse.Namespace, stages: Stages, decoding: Decoding):
        self.args, self.stages, self.decoding = args, stages, decoding
        self.work: Path = args.workdir
        self.rule = convergence.StopRule(args.validate_interval_updates, args.patience_updates, args.update_cap)
        self.load_log = self.work / "logs" / "load.tsv"
        #: The rows whose training failed in this run, with why: the rows after them still train.
        self.failures: Dict[str, str] = {}
        #: The validation loss at step 0 of every continued system, once the Transformer has converged.
        self.step0: Optional[Dict[str, Dict[str, float]]] = None

    def save_dir(self, name: str) -> Path:
        return self.work / "checkpoints" / name

    def log_dir(self, name: str) -> Path:
        return self.work / "logs" / f"train-{name}"

    def continued_lr(self) -> float:
        """The learning rate the Transformer had reached at its best checkpoint (where b. starts)."""
        best_update = self.stages.done[stage_names.train(REFERENCE)]["best_update"]
        return fairseq_runs.inverse_sqrt_lr(best_update, self.args.lr, self.args.warmup)

    def row_flags(self, row: Row) -> List[str]:
        flags = list(self.rule.fairseq_flags())
        if row.protocol == "continued":
            flags += ["--finetune-from-model", str(self.save_dir(REFERENCE) / "checkpoint_best.pt")]
            flags += fairseq_runs.continuation_flags(row.system, self.args.ramp_updates)
        if row.system != "baseline":
            flags += self.args.model_args.split()
        return flags + list(row.flags)

    def train(self, row: Row) -> Dict[str, object]:
        """Trains ``row`` (resuming) until its protocol stops it; returns what its run measured."""
        hp = dict(self.decoding.hp, seed=row.seed)
        if row.protocol == "continued":
            hp.update(schedule="fixed", lr=self.continued_lr())
            target = lambda best_update: self.args.warm_updates  # noqa: E731 (a fixed number of updates)
        else:
            target = self.rule.target
        save_dir, log_dir = self.save_dir(row.name), self.log_dir(row.name)

        def segment(start: int, max_update: int) -> None:
            fairseq_runs.train(self.decoding.data_bin, save_dir, row.system, self.args.shape, max_update, hp,
                               log_dir / f"from-{start}.log", extra=self.row_flags(row))

        def run() -> Dict[str, object]:
            start = time.time()
            progress = convergence.train_in_segments(segment, save_dir, target)
            converged = self.rule.converged(progress["best_update"], progress["stopped_at"])
            return training_record(progress, log_dir, converged, hp["lr"], mean_load(self.load_log, start, time.time()),
                                   provenance.provenance(self.args.gpu))

        return self.stages.run(stage_names.train(row.name), run, save_dir / "checkpoint_best.pt")

    def average(self, row: Row) -> Path:
        """The average of the row's last :data:`~.convergence.AVERAGED` interval checkpoints."""
        out = self.save_dir(row.name) / "checkpoint_average.pt"

        def run() -> Dict[str, object]:
            paths = convergence.interval_checkpoints(self.save_dir(row.name))[-convergence.AVERAGED:]
            convergence.average_checkpoints(paths, out)
            return {"updates": [convergence.checkpoint_updates(p)[0] for p in paths]}

        self.stages.run(stage_names.average(row.name), run, out)
        return out

    def score_references(self, row: Row) -> Dict[str, object]:
        """``fairseq-generate --score-reference`` with the best checkpoint, against the beam's hypotheses."""
        out = self.work / "translations" / f"{row.name}.score-reference.txt"

        def run() -> Dict[str, object]:
            fairseq_runs.generate(self.decoding.data_bin, self.save_dir(row.name) / "checkpoint_best.pt", out,
                                  self.work / "logs" / f"score-reference-{row.name}.log", self.decoding.hp,
                                  extra=["--score-reference"])
            hypotheses = convergence.hypothesis_scores(hypothesis_file(self.work, row.name))
            return convergence.search_errors(hypotheses, convergence.hypothesis_scores(out))

        return self.stages.run(stage_names.score_references(row.name), run, out)

    def continued_starts(self) -> Optional[Dict[str, Dict[str, float]]]:
        """Where the continued rows start: the validation loss of each continued system built from the
        converged Transformer's best checkpoint, before any update (the routing families also with their
        identity start and ramp, as they train), next to the Transformer's own; read from the stages with
        ``--report-only``."""
        stage = "validation loss at step 0 of the continued rows"
        if self.args.report_only:
            return self.stages.done.get(stage)
        systems = [s for s in CONTINUED if s in self.args.systems]
        return self.stages.run(stage, lambda: step0_losses(str(self.save_dir(REFERENCE) / "checkpoint_best.pt"),
                                                           self.decoding.data_bin, self.args.shape, systems))

    def evaluate(self, row: Row) -> Dict[str, object]:
        best = self.save_dir(row.name) / "checkpoint_best.pt"
        args = self.args
        result = {**self.stages.done[stage_names.train(row.name)], **asdict(row),
                  **score_row(row, args, self.decoding, self.stages, best),
                  "curve": train_logs.validation_curve(segment_logs(self.log_dir(row.name))),
                  "checkpoint": str(best)}
        result["average"] = {**score_row(row, args, self.decoding, self.stages, self.average(row), ".average"),
                             **self.stages.done[stage_names.average(row.name)]}
        result["references"] = self.score_references(row)
        if args.lenpen_grid:
            result["tuned"] = tune_row(row, args, self.decoding, self.stages, best,
                                       hypothesis_file(args.workdir, row.name))
        return result

    def run(self, rows: List[Row], report: Callable[[Dict[str, Dict[str, object]]], None]) -> None:
        """Trains the rows asked for (all by default) in order and evaluates every trained row;
        ``report(results)`` writes the tables after each row this run trained or failed, and at the end.
        A row whose training fails (:class:`~.fairseq_runs.ToolFailed`) is kept in :attr:`failures` and
        the next row trains; a later run tries it again from its last checkpoint."""
        results: Dict[str, Dict[str, object]] = {}
        removed: Set[str] = set()  # trained here before, their checkpoints removed since

        def collect(row: Row) -> None:  # a trained row evaluated
            if stage_names.train(row.name) not in self.stages.done:
                return
            if not (self.save_dir(row.name) / "checkpoint_best.pt").exists():
                removed.add(row.name)
                print(f"[converged] {row.name}: trained here before, its checkpoints removed since: not scored "
                      "again (a published result of it stays with --publish; --rows NAME trains it again)",
                      flush=True)
                return
            results[row.name] = self.evaluate(row)
            if row.name == REFERENCE:
                self.step0 = self.continued_starts()

        with LoadSampler(self.load_log):
            for row in rows:  # every row trained before this run first, so that every report lists them all
                collect(row)
            for row in (r for r in rows if r.name not in results):
                wanted = not self.args.report_only and (
                    row.name in self.args.rows if self.args.rows else row.name not in removed)
                if not wanted:
                    continue
                if row.protocol == "continued" and stage_names.train(REFERENCE) not in self.stages.done:
                    print(f"[converged] {row.name}: pending until {REFERENCE} has converged", flush=True)
                    continue
                try:
                    self.train(row)
                except fairseq_runs.ToolFailed as e:  # one row's failure does not hold up the days after it
                    self.failures[row.name] = str(e)
                    print(f"[converged] {row.name} failed: {e}; the next row trains", flush=True)
                    report(self.compared(rows, results))
                    continue
                collect(row)
                report(self.compared(rows, results))
        report(self.compared(rows, results))

    def compared(self, rows: List[Row], results: Dict[str, Dict[str, object]]) -> Dict[str, Dict[str, object]]:
        """``results`` with every row compared with its reference: best checkpoints, averages, tuned."""
        refs = (self.decoding.raw_refs, self.decoding.num_test, self.decoding.tokenize)
        compare(rows, results, lambda name: hypothesis_file(self.work, name), *refs)
        averaged = {name: res["average"] for name, res in results.items()}
        compare(rows, averaged, lambda name: hypothesis_file(self.work, f"{name}.average"), *refs)
        tuned = {name: res["tuned"] for name, res in results.items() if "tuned" in res}
        compare(rows, tuned, lambda name: hypothesis_file(self.work, f"{name}.lenpen"), *refs)
        return results
