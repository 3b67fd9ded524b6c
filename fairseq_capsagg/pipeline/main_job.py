#!/usr/bin/env python
"""The main job: train and compare layer-aggregation models on a real En->De corpus.

Run as ``capsagg-main-job``, ``python -m fairseq_capsagg.pipeline.main_job`` or, from a checkout,
``python examples/main_job.py``.

Stages (each prints one line when it starts and is skipped when already done):
corpus -> subwords -> binarise -> train (every system, same number of updates)
-> train the baseline further to the slowest system's training time
-> translate the test split -> score -> results.md / results.json.

    capsagg-main-job                   # baseline vs EM routing, small shape, CPU
    capsagg-main-job --quick           # a few minutes, for tests
    capsagg-main-job --shape base --systems baseline,linagg,dyncomb,dynrouting,emrouting \
        --max-update 100000 --max-tokens 4096 --lr 7e-4 --warmup 4000   # the paper's Table 1 on a GPU
"""

import argparse
import fcntl
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Dict, List

from sacrebleu.metrics import BLEU

from ..analysis import scoring
from . import corpus as corpus_mod
from . import fairseq_runs, report, subwords



#: ``--quick``, one mode for the main job and Table 1: minutes on 2 CPU cores, to try the pipeline end
#: to end and for its tests; nothing it learns is meant to be read. The sentences kept of each split, the
#: settings it fixes (each driver takes those of its flags), and fairseq's --log-interval.
QUICK_LIMITS = {"train": 3000, "valid": 60, "test": 60}
QUICK = {"vocab_size": 1000, "max_update": 20, "warmup": 5, "max_tokens": 1024, "beam": 2, "warm_updates": 10,
         "ramp_updates": 5, "validate_interval_updates": 5, "patience_updates": 10, "update_cap": 20}
QUICK_LOG_INTERVAL = 5


def apply_quick(args: argparse.Namespace) -> None:
    """Sets the :data:`QUICK` settings that ``args`` has as flags."""
    for key, value in QUICK.items():
        if hasattr(args, key):
            setattr(args, key, value)


def log_interval(args: argparse.Namespace) -> int:
    """fairseq's ``--log-interval``: every 50 updates, every :data:`QUICK_LOG_INTERVAL` with ``--quick``."""
    return QUICK_LOG_INTERVAL if args.quick else 50


class ConfigMismatch(RuntimeError):
    pass


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
    p.add_argument("--shape", choices=("small", "base", "big"), default="small")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint sentencepiece vocabulary")
    p.add_argument("--max-train-tokens", type=int, default=64, help="drop longer training pairs")
    p.add_argument("--max-update", type=int, default=900)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-equal-time", action="store_true",
                   help="skip the equal wall-clock rows (baseline trained on; aggregator warm-started "
                        "from the baseline)")
    p.add_argument("--model-args", default="",
                   help="extra fairseq-train flags for the aggregator systems, e.g. '--routing-iters 2'")
    p.add_argument("--gpu", action="store_true", help="train and decode on CUDA (default: CPU)")
    p.add_argument("--quick", action="store_true",
                   help="a few minutes: 3000 training pairs, 60 test pairs, 1k vocabulary, 20 updates, beam 2")
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
    keys = ["corpus", "shape", "vocab_size", "max_train_tokens", "max_update", "max_tokens", "lr",
            "warmup", "beam", "seed", "quick"]
    config = {k: (str(getattr(args, k)) if isinstance(getattr(args, k), Path) else getattr(args, k)) for k in keys}
    # settings added later are written only when they differ from what earlier work directories used
    optional = {"model_args": "", "source_lang": "en", "target_lang": "de", "subwords": "sentencepiece",
                "bpe_merges": None, "sacrebleu_tokenize": "13a"}
    config.update({k: getattr(args, k) for k, default in optional.items() if getattr(args, k) != default})
    return config


def check_workdir(workdir: Path, config: Dict[str, object]) -> None:
    """Refuses a work directory that holds results of another configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in config.items() if old.get(k) != v}
        if diff:
            raise ConfigMismatch(
                f"{workdir} holds results of another configuration ({', '.join(f'{k}: {a} -> {b}' for k, (a, b) in diff.items())}); "
                "nothing was changed. Use another --workdir, or rerun with the old settings.")
    else:
        path.write_text(json.dumps(config, indent=2))


class WorkdirBusy(RuntimeError):
    """Another process is running stages in the same work directory."""


class Stages:
    """Remembers finished stages (and what they measured) in workdir/stages.json.

    One process at a time owns a work directory (an exclusive lock on ``workdir/stages.lock``, released
    when the process ends): two writers of stages.json would each drop what the other recorded.
    """

    def __init__(self, workdir: Path):
        self._lock = open(workdir / "stages.lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            owner = self._lock.read().strip() or "unknown"
            self._lock.close()
            raise WorkdirBusy(f"{workdir} is in use by another run (pid {owner}); wait for it to finish, or use "
                              "another --workdir") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self.path = workdir / "stages.json"
        self.done: Dict[str, object] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def run(self, name: str, fn, *outputs: Path):
        if name in self.done and all(p.exists() for p in outputs):
            print(f"[main-job] {name}: done already, skipped", flush=True)
            return self.done[name]
        print(f"[main-job] {name} ...", flush=True)
        start = time.time()
        result = fn()
        self.done[name] = result
        self.path.write_text(json.dumps(self.done, indent=2))
        print(f"[main-job] {name}: finished in {time.time() - start:.0f}s", flush=True)
        return result


def prepare_data(args: argparse.Namespace, corpus_dir: Path, stages: "Stages", limits) -> Path:
    """Subwords and binarisation of ``corpus_dir`` into ``args.workdir``; returns the data-bin."""
    work = args.workdir
    model = subwords.subword_model(args.subwords, work)
    encoded = model.path.parent

    def make_subwords():
        size = args.bpe_merges or args.vocab_size
        learnt = subwords.learn(model, corpus_dir, args.pair, size, max_sentences=20000 if args.quick else 1_000_000,
                                grow_to_fit=args.quick)
        if learnt != size:
            print(f"[main-job] --quick: {size} subwords cannot hold this corpus' characters; learnt {learnt}, "
                  "sentencepiece's smallest vocabulary for them", flush=True)
        return {**subwords.encode_corpus(model, corpus_dir, args.pair, encoded, args.max_train_tokens, limits),
                "vocab_size": learnt}

    stages.run("subwords", make_subwords, model.path)
    data_bin = work / "data-bin"

    def binarise():
        # a binarisation stopped half way leaves files that fairseq-preprocess refuses to overwrite
        shutil.rmtree(data_bin, ignore_errors=True)
        fairseq_runs.run_logged("fairseq-preprocess", [
            "--source-lang", args.source_lang, "--target-lang", args.target_lang,
            "--trainpref", str(encoded / "train"), "--validpref", str(encoded / "valid"),
            "--testpref", str(encoded / "test"), "--joined-dictionary", "--destdir", str(data_bin),
            "--workers", "2"], work / "logs" / "preprocess.log")
        return {}

    stages.run("binarise", binarise, data_bin / f"dict.{args.source_lang}.txt")

    return data_bin


#: How the rows of the step-0 table that need flags to start as the Transformer (the routing
#: families) start besides their default: with those flags, and with them and a ramp.
IDENTITY_STARTS = {"identity": [], "identity + ramp": ["--aggregation-ramp-updates", "1"]}


def step0_losses(checkpoint: str, data_bin: Path, shape: str) -> Dict[str, Dict[str, float]]:
    """Validation loss at step 0 of a warm start from ``checkpoint``: every aggregator as built by
    default, and those with warm-start flags (the routing families) with each of :data:`IDENTITY_STARTS`."""
    from ..tools.warm_start_loss import warm_start_losses

    aggregators = fairseq_runs.systems()[1:]
    losses = warm_start_losses(checkpoint, str(data_bin), [f"transformer_{s}_{shape}" for s in aggregators])
    for start, extra in IDENTITY_STARTS.items():
        for system in (s for s in aggregators if fairseq_runs.warm_start_flags(s)):
            arch = f"transformer_{system}_{shape}"
            variant = warm_start_losses(checkpoint, str(data_bin), [arch],
                                        model_args=fairseq_runs.warm_start_flags(system) + extra)
            losses[f"{arch} ({start})"] = variant[arch]
    return losses


def unpack_corpus(tarball: "corpus_mod.CorpusTarball", dest: Path, pair, stages: "Stages") -> Path:
    """Unpacks (once) and checks a corpus tarball; returns the directory with its files."""
    def unpack():
        directory = corpus_mod.unpack_tarball(tarball.tarball, dest, tarball.sha256)
        corpus_mod.check_corpus_dir(directory, pair)
        return {"directory": str(directory)}

    done = stages.run("corpus", unpack, dest)
    # work directories from before tarballs with a top-level folder were accepted recorded split sizes only
    return Path(done["directory"]) if "directory" in done else dest


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.workdir
    try:
        config = config_of(args)
        tarball = None
        if args.corpus is None:
            tarball = corpus_mod.bundled_corpus(args.pair)
        elif args.corpus.is_file():
            tarball = corpus_mod.CorpusTarball(args.corpus, "")  # the user's tarball: no checksum to check
        else:
            corpus_mod.check_corpus_dir(args.corpus, args.pair)
        check_workdir(work, config)
    except (corpus_mod.CorpusError, ConfigMismatch) as e:
        print(f"main_job: error: {e}", file=sys.stderr)
        return 2
    try:
        stages = Stages(work)
    except WorkdirBusy as e:
        print(f"main_job: error: {e}", file=sys.stderr)
        return 2
    subword = subwords.subword_model(args.subwords, work)
    hp = {"lr": args.lr, "warmup": args.warmup, "max_tokens": args.max_tokens, "seed": args.seed,
          "beam": args.beam, "decode_batch": 32, "log_interval": log_interval(args),
          "device_flags": [] if args.gpu else ["--cpu"], "pair": args.pair,
          "remove_bpe": subword.fairseq_bpe}
    limits = QUICK_LIMITS if args.quick else None

    try:
        corpus_dir = args.corpus if tarball is None else unpack_corpus(tarball, work / "corpus", args.pair, stages)
    except corpus_mod.CorpusError as e:
        print(f"main_job: error: {e}", file=sys.stderr)
        return 2

    try:
        data_bin = prepare_data(args, corpus_dir, stages, limits)
    except subwords.VocabularyTooSmall as e:
        print(f"main_job: error: {e}", file=sys.stderr)
        return 2

    model_args = args.model_args.split()

    def train_row(name: str, system: str, max_update: int, extra=(), earlier_seconds: float = 0.0,
                  start_from: Path = None, start_update: int = 0):
        """Trains one row's model (resuming if interrupted) and reads fairseq's speed summary."""
        save_dir = work / "checkpoints" / name
        log = work / "logs" / f"train-{name}.log"

        def run():
            if start_from is not None:
                fairseq_runs.continue_from(start_from, save_dir)
            fairseq_runs.train(data_bin, save_dir, system, args.shape, max_update, hp, log,
                               extra=[*extra, *(model_args if system != "baseline" else [])])
            summary = fairseq_runs.train_summary(log, start_update)
            # fairseq's train_wall covers this process only: earlier_seconds adds what came before
            return {"updates": int(summary["num_updates"]), "updates_per_s": summary["ups"],
                    "target_tokens_per_s": summary["wps"],
                    "train_seconds": earlier_seconds + summary["train_wall"]}

        return dict(stages.run(f"train {name}", run, save_dir / "checkpoint_last.pt"), system=system,
                    checkpoint=str(save_dir / "checkpoint_last.pt"))

    results: Dict[str, Dict[str, object]] = {}
    for system in args.systems:
        results[system] = dict(train_row(system, system, args.max_update),
                               label=f"{fairseq_runs.label(system)} ({args.shape})")

    reference = args.systems[0]
    slowest = max(args.systems, key=lambda s: results[s]["train_seconds"])
    if reference == "baseline" and slowest != reference and not args.no_equal_time:
        base, slow = results[reference], results[slowest]
        longer = int(round(args.max_update * slow["train_seconds"] / base["train_seconds"]))
        results["baseline-equal-time"] = dict(
            train_row("baseline-equal-time", "baseline", longer, earlier_seconds=base["train_seconds"],
                      start_from=work / "checkpoints" / "baseline", start_update=base["updates"]),
            label=f"{fairseq_runs.label(fairseq_runs.BASELINE)} ({args.shape}), trained as long as row {args.systems.index(slowest) + 1}")
        # the same wall-clock spent as: baseline for max_update, then the aggregator on top of it
        extra_updates = max(1, int(round((slow["train_seconds"] - base["train_seconds"]) * slow["updates_per_s"])))
        results[f"{slowest}-warm-start"] = dict(
            train_row(f"{slowest}-warm-start", slowest, extra_updates, earlier_seconds=base["train_seconds"],
                      extra=["--finetune-from-model", str(work / "checkpoints" / "baseline" / "checkpoint_last.pt")]),
            label=f"{fairseq_runs.label(slowest)} ({args.shape}), warm-started from row 1, trained as long as row "
                  f"{args.systems.index(slowest) + 1}")
        results[f"{slowest}-warm-start"]["updates"] += base["updates"]

    step0 = None
    if "baseline" in results and not args.no_equal_time:
        step0 = stages.run("validation loss at step 0 of warm starts", lambda: step0_losses(
            results["baseline"]["checkpoint"], data_bin, args.shape))

    encoded = subword.path.parent
    num_test = corpus_mod.count_lines(encoded / f"test.{args.target_lang}")
    raw_refs = scoring.read_lines(corpus_dir / f"test.{args.target_lang}")[:num_test]
    tokenize = args.sacrebleu_tokenize
    for name, row in results.items():
        hyp_file = work / "translations" / f"{name}.txt"
        hyp_file.parent.mkdir(parents=True, exist_ok=True)

        def translate(row=row, hyp_file=hyp_file, name=name):
            speed = fairseq_runs.generate(data_bin, Path(row["checkpoint"]), hyp_file,
                                          work / "logs" / f"generate-{name}.log", hp)
            hyps, missing = scoring.align_hypotheses(scoring.read_generate_output(hyp_file), num_test)
            return {"decode_sentences_per_s": speed, "untranslated_ids": missing,
                    **scoring.corpus_scores(hyps, raw_refs, tokenize),
                    "params": report.count_checkpoint_parameters(Path(row["checkpoint"]))}

        row.update(stages.run(f"translate and score {name}", translate, hyp_file))

    print("[main-job] significance ...", flush=True)
    hyps = {name: scoring.align_hypotheses(
        scoring.read_generate_output(work / "translations" / f"{name}.txt"), num_test)[0] for name in results}
    names = list(results)
    boot = scoring.paired_bootstrap(hyps[names[0]], {n: hyps[n] for n in names[1:]}, raw_refs, tokenize=tokenize)
    rows: List[Dict[str, object]] = []
    for name in names:
        row = dict(results[name])
        if name != names[0]:
            sign = scoring.sign_test(hyps[names[0]], hyps[name], raw_refs, tokenize)
            row.update(delta_bleu=round(row["bleu"] - results[names[0]]["bleu"], 2), bootstrap_p=boot[name],
                       sign_p=sign["p_value"], sign_better=sign["better"], sign_worse=sign["worse"])
        rows.append(row)
    device = "GPU" if args.gpu else "CPU"
    corpus_name = f"the bundled {tarball.tarball.name.split('-v')[0]} corpus" if args.corpus is None else args.corpus
    signature = scoring.signatures(tokenize)
    caption = (f"{args.source_lang}->{args.target_lang}, test split of {corpus_name}"
               f" ({num_test} sentences{', --quick subset' if args.quick else ''}); {args.subwords} subwords; "
               f"shape {args.shape}; {args.max_update} updates of <= {args.max_tokens} tokens; {device}; "
               f"beam {args.beam}. sacrebleu: BLEU {signature['bleu']}; chrF {signature['chrf']}.")
    path = report.write_report(rows, work, caption, step0, sacrebleu=signature)
    print(f"[main-job] results written to {path} and {work / 'results.json'}\n")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
