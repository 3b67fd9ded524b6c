"""The paper's Table 1 on the bundled corpus, under both protocols, and its peers, resumably.

Every table runs on the bundled corpus of its pair: En->De by default (the paper's Table 1 task),
Zh->En with ``--source-lang zh --target-lang en`` (work directory and published tables suffixed
``-zhen``; BLEU tokenised as :func:`~fairseq_capsagg.analysis.scoring.bleu_tokenizer` says).

``--table paper`` (default), the paper's Table 1:

* From scratch: the Transformer and the four aggregators trained for the same number of updates
  (the first two seeds of the baseline, of EM routing and of both combinations, so the noise is on the
  page), and the ablations that say why routing loses (see :func:`.table1_rows.table_rows`).
* The paper's protocol ("initialized by the pre-trained model"): every aggregator warm-started
  from the same trained baseline (``--routing-init identity`` for the routing families, the
  output ramped in over ``--ramp-updates``) and trained ``--warm-updates`` more updates, against
  the baseline trained the same number of updates more (fresh optimizer and warm-up for every row).

``--table peers``, routing against the dense connections that came after it (DenseFormer's DWA,
attention over depth, MUDD), all from scratch against the same baseline rows:

* equal updates (two seeds of the baseline and of EM routing);
* equal wall-clock: each system trained for as long as the baseline's ``--max-update`` updates
  take, its number of updates fixed in advance from the training-speed ratios of
  ``--speed-json`` (``benchmarks/speed.py`` on this machine, the same shape).

``--table capsules``: dynamic routing from scratch at several capsule widths, both routing softmaxes, against the
Transformer of the paper's table (rows shared): which width learns (:func:`.table1_rows.capsule_rows`).

``--table converged`` (:mod:`.converged`): the Transformer to convergence, the paper's protocol from it,
every system from scratch to convergence. ``--table compute-equivalence`` (:mod:`.compute_equivalence`): systems from
scratch for a fixed budget, placed on the validation curves of published converged Transformers (:mod:`..equivalence`).

    python examples/table1.py                         # every row, ~9 h on 2 CPU cores
    python examples/table1.py --rows scratch-baseline-s1,warm-baseline    # some rows only
    python examples/table1.py --report-only --publish docs/results        # tables of the rows done
    python examples/table1.py --table peers --publish docs/results        # the peers (same workdir)
    python examples/table1.py --table converged --source-lang zh --target-lang en   # runs/converged-zhen
    python examples/table1.py --table compute-equivalence --reference-curve docs/results/converged-cpu.json

Every row is also decoded with beam search's length penalty (``--lenpen``) tuned on the validation
split for that row alone (``--lenpen-grid``), and compared again: a system that translates too short
is then told apart from one that chooses worse words. The whole grid costs one decoding of the
validation split (every finished hypothesis kept, each value's choice taken from them;
``length_penalty.rerank``).

Every row trains in its own directory and saves every ``--save-interval`` updates, so an
interrupted run resumes where it stopped; finished rows are skipped. The tables list every row,
the ones not trained yet as pending.
"""

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List

from sacrebleu.metrics import BLEU

from ...analysis import scoring
from .. import corpus as corpus_mod
from .. import equivalence, fairseq_runs, provenance, stage_names, train_logs
from ..data import prepare_data, references, unpack_corpus
from ..experiment import Stages, WorkdirError, add_setup_flags, apply_quick, hparams, open_workdir
from ..reports import converged_report, equivalence_report, publish, report
from ..reports.table1_report import format_tables
from ..rows import Decoding, Prepared, Row, compare, hypothesis_file, score_row, tune_row
from ..subwords import VocabularyTooSmall
from ..warm_starts import step0_losses
from . import compute_equivalence, converged
from .table1_rows import (EQUIVALENCE_SYSTEMS, capsule_rows, equivalence_rows, peer_rows, read_speed_ratios,
                          speed_ratios_by_device, table_rows)

#: Every table runs on the bundled corpus of its pair (``--source-lang``/``--target-lang``, by default
#: :data:`~.corpus.DEFAULT_PAIR`), in sentencepiece subwords.
PAIR = corpus_mod.DEFAULT_PAIR
SUBWORDS = "sentencepiece"


Results = Dict[str, Dict[str, object]]

#: The tables this script writes: its file name stem and the title of each protocol.
TABLES = {"paper": "table1", "peers": "peers", "capsules": "dynrouting-capsules", "converged": "converged",
          "compute-equivalence": "compute-equivalence"}
#: The tables trained by the stop rule (:mod:`.converged`): validated on a grid, averaged, capped.
STOP_RULE_TABLES = ("converged", "compute-equivalence")
#: ``--update-cap`` of each of them.
UPDATE_CAP = {"converged": 30000, "compute-equivalence": equivalence.UPDATE_CAP}

#: Further updates of every warm-start row: the paper's table (about 2/3 of an epoch), and the rows
#: continued from the converged Transformer (at least three epochs).
WARM_UPDATES = {"paper": 600, "converged": 3000}
#: Length penalties tuned on the validation split for every row of the paper's table and the peers.
LENPEN_GRID = "0.5,1,1.5,2,3"

#: Systems trained from scratch with a second seed by default: the baseline and EM routing (the noise
#: on the page), and in the paper's table the two combinations, whose gains over the baseline are its claims; in
#: the compute-equivalence table the three methods that save updates after one seed (the Transformer's seeds there:
#: :data:`~.table1_rows.EQUIVALENCE_TRANSFORMER_SEEDS`).
SECOND_SEED = {"paper": ("baseline", "emrouting", "linagg", "dyncomb"), "peers": ("baseline", "emrouting"),
               "capsules": (), "converged": converged.SECOND_SEED, "compute-equivalence": ("hc", "dyncomb", "mudd")}


def bundled_pairs() -> str:
    """The pairs with a bundled corpus, as the flags' help and errors write them (en-de, zh-en)."""
    return ", ".join(f"{source}-{target}" for source, target in corpus_mod.BUNDLED)


def pair_suffixed(stem: str, pair) -> str:
    """``stem`` for the default pair, ``stem-{source}{target}`` for another (the work directory and the
    published tables of each pair apart: converged, converged-zhen)."""
    return stem if tuple(pair) == PAIR else f"{stem}-{''.join(pair)}"


def table_stem(args: argparse.Namespace) -> str:
    """The file name stem of ``args.table``'s tables for ``args.pair`` (table1, peers, converged, converged-zhen)."""
    return pair_suffixed(TABLES[args.table], args.pair)


def rows_of(args: argparse.Namespace) -> List[Row]:
    """The rows of ``args.table`` for ``args.systems`` and ``args.second_seed``, in the order they train."""
    if args.table == "paper":
        return table_rows(args.systems, args.second_seed)
    if args.table == "compute-equivalence":
        return equivalence_rows(args.systems, args.second_seed)
    if args.table == "converged":
        return converged.converged_rows(args.systems, args.second_seed)
    if args.table == "capsules":
        return capsule_rows()
    return peer_rows(args.systems, args.second_seed, args.max_update, args.speed_ratios)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="table1", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=None,
                   help="default runs/table1 (the paper's table and the peers, which share rows), runs/converged, "
                        "runs/compute-equivalence; for another pair than en-de suffixed with it (runs/converged-zhen)")
    languages = sorted({lang for pair in corpus_mod.BUNDLED for lang in pair})
    p.add_argument("--source-lang", choices=languages, default=PAIR[0],
                   help=f"source language, a pair with a bundled corpus ({bundled_pairs()}; default {PAIR[0]})")
    p.add_argument("--target-lang", choices=languages, default=PAIR[1], help=f"target language (default {PAIR[1]})")
    p.add_argument("--table", choices=tuple(TABLES), default="paper",
                   help="the paper's Table 1, routing against its peers, dynamic routing's capsule widths (rows "
                        "from scratch are shared), the converged comparison (fairseq_capsagg/pipeline/drivers/"
                        "converged.py), or compute-equivalence from scratch (fairseq_capsagg/pipeline/equivalence.py)")
    p.add_argument("--systems", default=None,
                   help=f"comma-separated, from {','.join(fairseq_runs.systems())} (default: the paper's "
                        f"{','.join(fairseq_runs.paper_systems())}; with --table peers: baseline,emrouting,"
                        f"{','.join(fairseq_runs.peer_systems())}; with --table converged: "
                        f"{','.join(converged.default_systems())}; with --table compute-equivalence: "
                        f"{','.join(EQUIVALENCE_SYSTEMS)})")
    p.add_argument("--speed-json", type=Path, action="append", default=None,
                   help="benchmarks/speed.py's JSON (default benchmarks/results/speed.json). --table peers: the "
                        "training-speed ratios that fix the updates of the equal wall-clock rows (one file); "
                        "--table compute-equivalence: those that turn its ratios in updates into seconds, one file "
                        "per machine the rows trained on (repeat the flag), each row read with its own machine's")
    p.add_argument("--second-seed", default=None,
                   help="systems also trained with seed 2 ('' for none; with --table converged from scratch and, "
                        "where the paper's protocol continues them, continued; default: "
                        + "; ".join(f"{table}: {','.join(seeds)}" for table, seeds in SECOND_SEED.items()) + ")")
    p.add_argument("--rows", default="", help="train only these rows (comma-separated names); default all")
    p.add_argument("--warm-updates", type=int, default=None,
                   help=f"K: updates of every warm-start row (default {WARM_UPDATES['paper']}; with --table converged "
                        f"{WARM_UPDATES['converged']}, the further updates of every continued row)")
    p.add_argument("--validate-interval-updates", type=int, default=500,
                   help="--table converged, compute-equivalence: validation every N updates (fairseq's, on the "
                        "validation split)")
    p.add_argument("--patience-updates", type=int, default=None,
                   help="--table converged: a row from scratch stops when its best validation loss has not "
                        "improved for N updates (default 3000; compute-equivalence rows train to the cap)")
    p.add_argument("--update-cap", type=int, default=None,
                   help="--table converged, compute-equivalence: at most N updates per row (default "
                        + ", ".join(f"{n} with {table}" for table, n in UPDATE_CAP.items()) + ")")
    p.add_argument("--reference-curve", type=Path, action="append", default=[],
                   help="--table compute-equivalence (required, once per run): a converged table's JSON "
                        "(capsagg-table1 --table converged) whose Transformer's validation curve the rows are placed "
                        "on, e.g. docs/results/converged-cpu.json")
    p.add_argument("--ramp-updates", type=int, default=fairseq_runs.RAMP_UPDATES,
                   help="--aggregation-ramp-updates of the warm-started aggregators (default "
                        f"{fairseq_runs.RAMP_UPDATES})")
    p.add_argument("--lenpen-grid", default=None,
                   help="length penalties tried on the validation split for every row, the best decoding the "
                        f"test split a second time ('' for none; default {LENPEN_GRID}, with --table converged none)")
    p.add_argument("--save-interval", type=int, default=100, help="checkpoint every N updates (resume point)")
    p.add_argument("--report-only", action="store_true", help="train nothing; write the tables of the rows done")
    p.add_argument("--publish", type=Path, default=None,
                   help="also write the tables as DIR/{table1,peers,dynrouting-capsules,converged}-{cpu,gpu}.{md,json} "
                        "(compute-equivalence: DIR/compute-equivalence.{md,json,png}); every table but converged keeps "
                        "the rows the table there has that this work directory has not scored, when its settings "
                        "are this run's (and, but for compute-equivalence, when the row each was compared against "
                        "scores the same here)")
    add_setup_flags(p)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The flags with their table's defaults, checked: a bad one stops here with one error line naming it."""
    p = build_parser()
    args = p.parse_args(argv)
    args.pair = (args.source_lang, args.target_lang)
    if args.pair not in corpus_mod.BUNDLED:
        p.error(f"--source-lang {args.source_lang} --target-lang {args.target_lang}: no bundled corpus of that "
                f"pair; choose from {bundled_pairs()}")
    try:
        apply_table_defaults(args)
        check_settings(args)
        if args.quick:
            apply_quick(args)
        check_table(args)
    except ValueError as e:
        p.error(str(e))
    return args


def apply_table_defaults(args: argparse.Namespace) -> None:
    """The flags left unset take ``args.table``'s defaults; the comma-separated lists become lists. ValueError
    naming a flag that ``args.table`` does not take."""
    args.sacrebleu_tokenize = scoring.bleu_tokenizer(args.target_lang)
    if args.workdir is None:
        stem = args.table if args.table in STOP_RULE_TABLES else "table1"
        args.workdir = Path("runs/" + pair_suffixed(stem, args.pair))
    if args.table in STOP_RULE_TABLES:
        if args.update_cap is None:
            args.update_cap = UPDATE_CAP[args.table]
        if args.table == "compute-equivalence" and args.patience_updates is not None:
            raise ValueError("--patience-updates: not with --table compute-equivalence (its rows train to "
                             "--update-cap)")
        if args.patience_updates is None:
            args.patience_updates = 3000 if args.table == "converged" else args.update_cap
    if args.warm_updates is None:
        args.warm_updates = WARM_UPDATES["converged" if args.table == "converged" else "paper"]
    if args.lenpen_grid is None:
        args.lenpen_grid = "" if args.table == "converged" else LENPEN_GRID
    if args.systems is None:
        args.systems = ",".join(fairseq_runs.paper_systems() if args.table == "paper"
                                else converged.default_systems() if args.table == "converged"
                                else EQUIVALENCE_SYSTEMS if args.table == "compute-equivalence"
                                else ["baseline", "dynrouting"] if args.table == "capsules"
                                else ["baseline", "emrouting", *fairseq_runs.peer_systems()])
    default_second_seed = args.second_seed is None
    for key in ("systems", "second_seed", "rows"):
        setattr(args, key, [s.strip() for s in (getattr(args, key) or "").split(",") if s.strip()])
    if default_second_seed:
        args.second_seed = [s for s in SECOND_SEED[args.table] if s in args.systems]


def check_settings(args: argparse.Namespace) -> None:
    """ValueError naming the flag when a system, the length-penalty grid or a number of updates is not one
    allowed; the grid becomes its sorted numbers."""
    bad = [s for s in args.systems + args.second_seed if s not in fairseq_runs.systems()]
    needs_baseline = args.table != "compute-equivalence"  # placed on published Transformer curves instead
    if bad or not args.systems or (needs_baseline and "baseline" not in args.systems):
        raise ValueError(f"--systems/--second-seed: unknown {bad} or no baseline; choose from "
                         f"{', '.join(fairseq_runs.systems())} (baseline is required but with --table "
                         "compute-equivalence)")
    try:
        args.lenpen_grid = sorted({float(v) for v in args.lenpen_grid.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--lenpen-grid: {args.lenpen_grid!r} is not a comma-separated list of numbers "
                         "(e.g. 0.5,1,2)") from None
    if args.warm_updates < 1 or args.max_update < 1 or args.ramp_updates < 0:
        raise ValueError("--max-update and --warm-updates must be >= 1 and --ramp-updates >= 0")


def check_table(args: argparse.Namespace) -> None:
    """ValueError naming the flag when a setting does not fit ``args.table`` (after ``--quick``'s); reads the
    peers' speed ratios, and checks ``--rows`` against the table's rows."""
    if args.table == "compute-equivalence":
        args.patience_updates = args.update_cap  # after --quick's: no early stop, every row trains to the cap
        if not args.reference_curve:
            raise ValueError("--reference-curve: required with --table compute-equivalence (a converged table's "
                             "JSON, once per Transformer run, e.g. docs/results/converged-cpu.json)")
        args.reference_curves = equivalence_report.read_reference_curves(args.reference_curve)
    args.published_results = {}
    if args.publish and args.table != "converged":  # the tables that keep the published rows not trained here
        published = publish.published_name(f"{table_stem(args)}.json", args.gpu,
                                           device_suffix=args.table != "compute-equivalence")
        args.published_results = publish.published_results(args.publish / published, config_of(args))
    if args.table in STOP_RULE_TABLES:
        converged.convergence.StopRule(args.validate_interval_updates, args.patience_updates, args.update_cap)
    if args.table == "converged":
        if args.warm_updates % args.validate_interval_updates:
            raise ValueError(f"--warm-updates {args.warm_updates}: a multiple of --validate-interval-updates "
                             f"{args.validate_interval_updates} (the continued rows are validated and averaged on "
                             "that grid)")
    missing = [path for path in args.speed_json or () if not path.is_file()]
    if args.table == "compute-equivalence" and missing:  # the default's absence only leaves the seconds out
        raise ValueError(f"--speed-json: {missing[0]} does not exist; run python benchmarks/speed.py --shapes "
                         f"{args.shape} on the machine the rows train on")
    args.speed_json = args.speed_json or [Path("benchmarks/results/speed.json")]
    if args.table == "peers" and len(args.speed_json) > 1:
        raise ValueError(f"--speed-json: one file with --table peers (its updates are fixed from this machine's "
                         f"ratios), not {len(args.speed_json)}")
    args.speed_ratios = (read_speed_ratios(args.speed_json[0], args.shape, args.systems) if args.table == "peers"
                         else speed_ratios_by_device(args.speed_json, args.shape)
                         if args.table == "compute-equivalence" else {})
    names = [row.name for row in rows_of(args)]
    unknown = [r for r in args.rows if r not in names]
    if unknown:
        raise ValueError(f"--rows: unknown {unknown}; choose from {', '.join(names)}")


def config_of(args: argparse.Namespace) -> Dict[str, object]:
    """The settings a work directory's results depend on (its config.json; another run must match them)."""
    keys = ["shape", "vocab_size", "max_train_tokens", "max_update", "warm_updates", "ramp_updates",
            "max_tokens", "lr", "warmup", "beam", "quick", "model_args"]
    if args.table == "converged":
        keys = [k for k in keys if k != "max_update"] + ["validate_interval_updates", "patience_updates", "update_cap"]
    if args.table == "compute-equivalence":
        keys = [k for k in keys if k not in ("max_update", "warm_updates", "ramp_updates")]
        keys += ["validate_interval_updates", "update_cap"]
    if args.pair != PAIR:  # written only for another pair: work directories from before hold en-de
        keys += ["source_lang", "target_lang"]
    config = {k: getattr(args, k) for k in keys}
    return config


def row_flags(row: Row, args: argparse.Namespace, baseline_checkpoint: Path) -> List[str]:
    """``fairseq-train`` flags of ``row`` beyond the shared ones: a warm start from ``baseline_checkpoint`` with
    its identity start and ramp, ``--model-args`` for aggregators, the row's own flags last (they win)."""
    flags: List[str] = []
    if row.protocol == "warm":
        flags += ["--finetune-from-model", str(baseline_checkpoint)]
        flags += fairseq_runs.continuation_flags(row.system, args.ramp_updates)
    if row.system != "baseline":
        flags += args.model_args.split()
    return flags + list(row.flags)


def train_row(row: Row, args: argparse.Namespace, data_bin: Path, stages: Stages, hp: Dict[str, object]):
    """Trains ``row`` of Table 1 or the peers (once: a stage) for its number of updates; returns what its log
    measured (updates, speed, wall-clock, gradient norm and clipping)."""
    work = args.workdir
    save_dir = work / "checkpoints" / row.name
    log = work / "logs" / f"train-{row.name}.log"
    max_update = row.max_update or (args.warm_updates if row.protocol == "warm" else args.max_update)
    baseline = work / "checkpoints" / "scratch-baseline-s1" / "checkpoint_last.pt"

    def run():
        fairseq_runs.train(data_bin, save_dir, row.system, args.shape, max_update, dict(hp, seed=row.seed), log,
                           extra=row_flags(row, args, baseline))
        summary = train_logs.train_summary(log)
        return {"updates": int(summary["num_updates"]), "updates_per_s": summary["ups"],
                "target_tokens_per_s": summary["wps"], "train_seconds": summary["train_wall"],
                "grad_norm": summary["gnorm"], "clip_percent": summary["clip"],
                "load_average": os.getloadavg()[2], **provenance.provenance(args.gpu)}

    return stages.run(stage_names.train(row.name), run, save_dir / "checkpoint_last.pt")


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.workdir
    try:
        stages = open_workdir(work, config_of(args), "table1")
        # the pair's bundled corpus (by default the paper's Table 1 task, En->De), in sentencepiece subwords
        tarball = corpus_mod.bundled_corpus(args.pair)
        corpus_dir = unpack_corpus(tarball, work / "corpus", args.pair, stages)
        prepared = prepare(args, stages, corpus_dir, tarball.name)
    except (WorkdirError, corpus_mod.CorpusError, VocabularyTooSmall) as e:
        print(f"table1: error: {e}", file=sys.stderr)
        return 2
    rows = rows_of(args)
    if args.table == "converged":
        return run_converged(args, stages, prepared, rows)
    if args.table == "compute-equivalence":
        return compute_equivalence.run(args, stages, prepared, rows, table_stem(args), config_of(args))
    run_table(args, stages, prepared, rows)
    return 0


def prepare(args: argparse.Namespace, stages: Stages, corpus_dir: Path, corpus_name: str) -> Prepared:
    """The corpus of ``args.pair`` (unpacked in ``corpus_dir`` from ``corpus_name``) in subwords and binarised,
    fairseq's settings, the references and the captions' common parts."""
    work, pair = args.workdir, args.pair
    data_bin = prepare_data(work, corpus_dir, pair, SUBWORDS, args.vocab_size, args.max_train_tokens, args.quick,
                            stages)
    hp = hparams(args, pair, SUBWORDS, save_interval_updates=args.save_interval)
    raw_refs, num_test = references(work, corpus_dir, SUBWORDS, pair[1])
    valid_refs, _ = references(work, corpus_dir, SUBWORDS, pair[1], "valid")
    direction = "" if pair == PAIR else f"{pair[0]}->{pair[1]}, "
    test_split = (f"Test split of the bundled {corpus_name} corpus ({direction}{num_test} sentences"
                  f"{', --quick subset' if args.quick else ''})")
    tokenize = args.sacrebleu_tokenize
    bleu_signature = "" if tokenize == BLEU.TOKENIZER_DEFAULT else f" BLEU tokenised with sacrebleu's {tokenize}."
    return Prepared(Decoding(data_bin, hp, raw_refs, num_test, valid_refs, tokenize), f"{test_split}; shape {args.shape}",
                    f"{provenance.device_name(args.gpu)}; beam {args.beam}.{bleu_signature}")


def run_converged(args: argparse.Namespace, stages: Stages, prepared: Prepared, rows: List[Row]) -> int:
    """``--table converged``: trains and scores its rows (:mod:`.converged`), writing the tables
    (:mod:`.converged_report`) after each; 1 if a row failed."""
    caption = (f"{prepared.caption_head}; <= {args.max_tokens} tokens per update; lr {args.lr}, warm-up "
               f"{args.warmup}, inverse square root; {prepared.caption_tail}")
    comparison = converged.ConvergedTable(args, stages, prepared.decoding)

    stem = table_stem(args)

    def report_converged(results: Dict[str, Dict[str, object]]) -> None:
        equivalence = converged_report.compute_equivalence(rows, results)
        payload = {"caption": caption, "config": config_of(args), "rows": [asdict(r) for r in rows],
                   "results": results, "failures": comparison.failures, "compute_equivalence": equivalence,
                   "continued_step0": comparison.step0, "lenpen_grid": args.lenpen_grid}
        curves = args.workdir / f"{stem}-curves.png"
        converged_report.plot_curves(rows, results, equivalence, curves)
        markdown = converged_report.format_tables(rows, results, equivalence, caption, args,
                                                  comparison.failures, comparison.step0)
        publish.write_outputs(args, stem, markdown, payload, [curves])

    comparison.run(rows, report_converged)
    return 1 if comparison.failures else 0


def trained_result(row: Row, args: argparse.Namespace, stages: Stages, prepared: Prepared) -> Dict[str, object]:
    """A trained row's result: its training record, its scores from its last checkpoint (and, with
    ``--lenpen-grid``, with the length penalty tuned on the validation split), its settings and final
    validation loss."""
    checkpoint = args.workdir / "checkpoints" / row.name / "checkpoint_last.pt"
    result = {**stages.done[stage_names.train(row.name)],
              **score_row(row, args, prepared.decoding, stages, checkpoint),
              **asdict(row),
              "valid": train_logs.final_valid_loss(args.workdir / "logs" / f"train-{row.name}.log"),
              "checkpoint": str(checkpoint)}
    if args.lenpen_grid:
        result["tuned"] = tune_row(row, args, prepared.decoding, stages, checkpoint,
                                   hypothesis_file(args.workdir, row.name))
    return result


def kept_published(published: Results, results: Results) -> Results:
    """The rows of the published table (``--publish``) that this work directory has not scored, kept when the
    row each was compared against scored the same test BLEU and chrF here (the same model: its comparisons still
    hold), so that a table trained a few rows at a time on machines that do not keep their runs stays whole."""
    def reproduced(name: str) -> bool:
        return name in results and name in published and all(
            results[name].get(key) == published[name].get(key) for key in ("bleu", "chrf"))
    return {name: res for name, res in published.items() if name not in results and reproduced(res["reference"])}


def run_table(args: argparse.Namespace, stages: Stages, prepared: Prepared, rows: List[Row]) -> None:
    """``--table paper`` or ``peers``: trains the rows asked for and not trained yet, scores every trained row
    and writes the table."""
    work, decoding = args.workdir, prepared.decoding
    data_bin, refs = decoding.data_bin, (decoding.raw_refs, decoding.num_test, decoding.tokenize)
    results: Dict[str, Dict[str, object]] = {}
    for row in rows:
        done = stage_names.translate_and_score(row.name) in stages.done
        if not args.report_only and (not args.rows or row.name in args.rows) and not done:
            stages.done[stage_names.train(row.name)] = train_row(row, args, data_bin, stages, decoding.hp)
        if stage_names.train(row.name) in stages.done:
            results[row.name] = trained_result(row, args, stages, prepared)
    compare(rows, results, lambda name: hypothesis_file(work, name), *refs)
    tuned = {name: res["tuned"] for name, res in results.items() if "tuned" in res}
    compare(rows, tuned, lambda name: hypothesis_file(work, f"{name}.lenpen"), *refs)
    results = {**kept_published(args.published_results, results), **results}
    step0 = None
    if args.table == "paper" and "scratch-baseline-s1" in results:
        step0 = stages.run(stage_names.STEP0_WARM_STARTS, lambda: step0_losses(
            results["scratch-baseline-s1"]["checkpoint"], data_bin, args.shape))
    warm = (f"warm start {args.warm_updates} more updates (ramp {args.ramp_updates}); " if args.table == "paper"
            else "")
    caption = (f"{prepared.caption_head}; from scratch {args.max_update} updates, {warm}<= {args.max_tokens} "
               f"tokens per update; lr {args.lr}, warm-up {args.warmup}; {prepared.caption_tail}")
    table = format_tables(rows, results, caption, args) + ("\n" + report.format_step0(step0) if step0 else "")
    payload = {"caption": caption, "config": config_of(args), "rows": [asdict(r) for r in rows],
               "results": results, "warm_start_step0": step0, "lenpen_grid": args.lenpen_grid}
    if args.table == "peers":
        payload["speed_ratios"] = {"source": str(args.speed_json[0]), "ratios": args.speed_ratios}
    publish.write_outputs(args, table_stem(args), table, payload)


if __name__ == "__main__":
    sys.exit(main())
