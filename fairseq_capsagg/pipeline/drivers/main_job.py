#!/usr/bin/env python
"""The main job: train and compare layer-aggregation models on a real En->De corpus.

Run as ``capsagg-main-job``, ``python -m fairseq_capsagg.pipeline.drivers.main_job`` or, from a checkout,
``python examples/main_job.py``.

Stages (each prints one line when it starts and is skipped when already done):
corpus -> subwords -> binarise -> train (every system, same number of updates)
-> train the baseline further to the slowest system's training time
-> translate the test split -> score -> results.md / results.json.

    capsagg-main-job                   # baseline vs EM routing, small shape, CPU
    capsagg-main-job --quick           # a few minutes, for tests
    capsagg-main-job --shape base --systems baseline,linagg,dyncomb,dynrouting,emrouting \
        --max-update 100000 --max-tokens 4096 --lr 7e-4 --warmup 4000 --gpu   # the paper's Table 1 on a GPU
"""

import argparse
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence

from sacrebleu.metrics import BLEU

from ...analysis import scoring
from .. import corpus as corpus_mod
from .. import fairseq_runs, provenance, stage_names, subwords, train_logs
from ..data import prepare_data, references, unpack_corpus
from ..experiment import Stages, WorkdirError, add_setup_flags, apply_quick, hparams, open_workdir
from ..reports import report
from ..rows import Decoding, Row, compare, hypothesis_file, score_row
from ..warm_starts import step0_losses


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="main_job", description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=Path("runs/main"), help="where every stage writes")
    p.add_argument("--source-lang", default="en", help="source language: the suffix of the corpus files (default en)")
    p.add_argument("--target-lang", default="de", help="target language (default de)")
    p.add_argument("--corpus", type=Path, default=None,
                   help="directory or .tar.* with {train,valid,test}.{SRC,TGT}; default: the bundled corpus of "
                        f"the pair ({', '.join(f'{s}-{t}' for s, t in corpus_mod.BUNDLED)})")
    p.add_argument("--subwords", choices=subwords.SUBWORD_METHODS, default="sentencepiece",
                   help="joint subwords: sentencepiece BPE (default) or subword-nmt BPE (the paper's)")
    p.add_argument("--bpe-merges", type=int, default=None,
                   help="subword-nmt: number of merges (default: --vocab-size)")
    p.add_argument("--sacrebleu-tokenize", choices=list(BLEU.TOKENIZERS), default=None,
                   help="sacrebleu's BLEU tokenizer (default: zh for a Chinese target, 13a otherwise)")
    p.add_argument("--systems", default="baseline,emrouting",
                   help=f"comma-separated, the first is the reference; from {','.join(fairseq_runs.systems())}")
    add_setup_flags(p)
    p.add_argument("--seed", type=int, default=1, help="training seed of every row (default 1)")
    p.add_argument("--no-equal-time", action="store_true",
                   help="skip the equal wall-clock rows (baseline trained on; aggregator warm-started "
                        "from the baseline)")
    args = p.parse_args(argv)
    args.pair = (args.source_lang, args.target_lang)
    if args.source_lang == args.target_lang:
        p.error(f"--source-lang and --target-lang are both {args.source_lang!r}")
    if args.bpe_merges is not None and (args.subwords != "subword-nmt" or args.bpe_merges < 1):
        p.error(f"--bpe-merges {args.bpe_merges}: a positive number of merges, with --subwords subword-nmt")
    args.sacrebleu_tokenize = args.sacrebleu_tokenize or scoring.bleu_tokenizer(args.target_lang)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    bad = [s for s in args.systems if s not in fairseq_runs.systems()]
    if bad or not args.systems:
        p.error(f"--systems: unknown {bad}; choose from {', '.join(fairseq_runs.systems())}")
    if args.quick:
        apply_quick(args)
    return args


def config_of(args: argparse.Namespace) -> Dict[str, object]:
    """The settings the main job's results depend on (its work directory's config.json)."""
    keys = ["corpus", "shape", "vocab_size", "max_train_tokens", "max_update", "max_tokens", "lr",
            "warmup", "beam", "seed", "quick"]
    config = {k: (str(getattr(args, k)) if isinstance(getattr(args, k), Path) else getattr(args, k)) for k in keys}
    # settings added later are written only when they differ from what earlier work directories used
    optional = {"model_args": "", "source_lang": "en", "target_lang": "de", "subwords": "sentencepiece",
                "bpe_merges": None, "sacrebleu_tokenize": "13a"}
    config.update({k: getattr(args, k) for k, default in optional.items() if getattr(args, k) != default})
    return config


def locate_corpus(args: argparse.Namespace) -> Optional[corpus_mod.CorpusTarball]:
    """The corpus to unpack (``--corpus`` as a tarball, or the pair's bundled one), or None for ``--corpus`` as a
    directory, checked here: a bad corpus stops the job before its work directory is made."""
    if args.corpus is None:
        return corpus_mod.bundled_corpus(args.pair)
    if args.corpus.is_file():
        return corpus_mod.CorpusTarball(args.corpus, "")  # the user's tarball: no checksum to check
    corpus_mod.check_corpus_dir(args.corpus, args.pair)
    return None


class Setup(NamedTuple):
    """What every row of the main job trains with."""
    work: Path
    stages: Stages
    data_bin: Path
    hp: Dict[str, object]
    shape: str
    model_args: List[str]  # --model-args, given to every system but the Transformer


def train_row(setup: Setup, name: str, system: str, max_update: int, extra: Sequence[str] = (),
              earlier_seconds: float = 0.0, start_from: Optional[Path] = None,
              start_update: int = 0) -> Dict[str, object]:
    """Trains one row's model (resuming if interrupted; from a copy of ``start_from``'s checkpoints if given) and
    reads fairseq's speed summary of the updates after ``start_update``."""
    save_dir = setup.work / "checkpoints" / name
    log = setup.work / "logs" / f"train-{name}.log"

    def run():
        if start_from is not None:
            fairseq_runs.continue_from(start_from, save_dir)
        fairseq_runs.train(setup.data_bin, save_dir, system, setup.shape, max_update, setup.hp, log,
                           extra=[*extra, *(setup.model_args if system != fairseq_runs.BASELINE else [])])
        summary = train_logs.train_summary(log, start_update)
        # fairseq's train_wall covers this process only: earlier_seconds adds what came before
        return {"updates": int(summary["num_updates"]), "updates_per_s": summary["ups"],
                "target_tokens_per_s": summary["wps"], "train_seconds": earlier_seconds + summary["train_wall"]}

    return dict(setup.stages.run(stage_names.train(name), run, save_dir / "checkpoint_last.pt"), system=system,
                checkpoint=str(save_dir / "checkpoint_last.pt"))


def equal_time_rows(args: argparse.Namespace, setup: Setup,
                    results: Dict[str, Dict[str, object]]) -> Dict[str, Dict[str, object]]:
    """The same wall-clock as the slowest system spent, spent two other ways: the Transformer trained on, and the
    slowest system warm-started from the Transformer for the time left; none when the Transformer is not the
    first system or is itself the slowest."""
    reference = args.systems[0]
    slowest = max(args.systems, key=lambda s: results[s]["train_seconds"])
    if reference != fairseq_runs.BASELINE or slowest == reference:
        return {}
    base, slow = results[reference], results[slowest]
    position = args.systems.index(slowest) + 1
    longer = int(round(args.max_update * slow["train_seconds"] / base["train_seconds"]))
    rows = {"baseline-equal-time": dict(
        train_row(setup, "baseline-equal-time", reference, longer, earlier_seconds=base["train_seconds"],
                  start_from=Path(base["checkpoint"]).parent, start_update=base["updates"]),
        label=f"{fairseq_runs.label(reference)} ({args.shape}), trained as long as row {position}")}
    extra_updates = max(1, int(round((slow["train_seconds"] - base["train_seconds"]) * slow["updates_per_s"])))
    # the paper's protocol as the README prescribes it: the identity start, the aggregate ramped in
    ramp = min(fairseq_runs.RAMP_UPDATES, extra_updates)
    warm = train_row(setup, f"{slowest}-warm-start", slowest, extra_updates, earlier_seconds=base["train_seconds"],
                     extra=["--finetune-from-model", base["checkpoint"],
                            *fairseq_runs.continuation_flags(slowest, ramp)])
    rows[f"{slowest}-warm-start"] = dict(
        warm, updates=warm["updates"] + base["updates"],
        label=f"{fairseq_runs.label(slowest)} ({args.shape}), continued from row 1 (identity start, {ramp}-update "
              f"ramp), trained as long as row {position}")
    return rows


def caption_of(args: argparse.Namespace, tarball: Optional[corpus_mod.CorpusTarball], num_test: int,
               signature: Dict[str, str]) -> str:
    """The results table's caption: the test split, the training and sacrebleu's signatures."""
    corpus_name = f"the bundled {tarball.name} corpus" if args.corpus is None else args.corpus
    return (f"{args.source_lang}->{args.target_lang}, test split of {corpus_name}"
            f" ({num_test} sentences{', --quick subset' if args.quick else ''}); {args.subwords} subwords; "
            f"shape {args.shape}; {args.max_update} updates of <= {args.max_tokens} tokens; "
            f"{provenance.device_name(args.gpu)}; beam {args.beam}. sacrebleu: BLEU {signature['bleu']}; "
            f"chrF {signature['chrf']}.")


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.workdir
    try:
        config = config_of(args)
        tarball = locate_corpus(args)
        stages = open_workdir(work, config)
        corpus_dir = args.corpus if tarball is None else unpack_corpus(tarball, work / "corpus", args.pair, stages)
        data_bin = prepare_data(work, corpus_dir, args.pair, args.subwords, args.bpe_merges or args.vocab_size,
                                args.max_train_tokens, args.quick, stages)
    except (corpus_mod.CorpusError, WorkdirError, subwords.VocabularyTooSmall) as e:
        print(f"main_job: error: {e}", file=sys.stderr)
        return 2
    hp = hparams(args, args.pair, subwords.subword_model(args.subwords, work).fairseq_bpe, seed=args.seed)
    setup = Setup(work, stages, data_bin, hp, args.shape, args.model_args.split())

    results: Dict[str, Dict[str, object]] = {
        system: dict(train_row(setup, system, system, args.max_update),
                     label=f"{fairseq_runs.label(system)} ({args.shape})") for system in args.systems}
    step0 = None
    if not args.no_equal_time:
        results.update(equal_time_rows(args, setup, results))
        if fairseq_runs.BASELINE in results:
            step0 = stages.run(stage_names.STEP0_WARM_STARTS, lambda: step0_losses(
                results[fairseq_runs.BASELINE]["checkpoint"], data_bin, args.shape))

    raw_refs, num_test = references(work, corpus_dir, args.subwords, args.target_lang)
    tokenize = args.sacrebleu_tokenize
    rows = [Row(name, row["system"], "scratch", args.seed, args.systems[0]) for name, row in results.items()]
    decoding = Decoding(data_bin, hp, raw_refs, num_test, tokenize=tokenize)
    for row in rows:
        results[row.name].update(score_row(row, args, decoding, stages, Path(results[row.name]["checkpoint"])))
    print("[main-job] significance ...", flush=True)
    compare(rows, results, lambda name: hypothesis_file(work, name), raw_refs, num_test, tokenize,
            details=False)
    signature = scoring.signatures(tokenize)
    path = report.write_report(list(results.values()), work, caption_of(args, tarball, num_test, signature), step0,
                               sacrebleu=signature)
    print(f"[main-job] results written to {path} and {work / 'results.json'}\n")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
