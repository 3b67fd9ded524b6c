#!/usr/bin/env python
"""Cleans, segments (sentencepiece BPE, 32K joint vocabulary as the paper's 32K merges) and
binarises a WMT corpus that the download scripts wrote as {train,valid,test}.{src,tgt}.

    python examples/wmt/prepare_wmt.py --raw-dir raw/wmt14 --src en --tgt de --out-dir data/wmt14
    python examples/main_job.py ... # or fairseq-train OUT_DIR/data-bin --user-dir fairseq_capsagg ...
"""

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Tuple

import sentencepiece as spm

from fairseq_capsagg.pipeline.fairseq_runs import tool_command


def clean_pairs(src_path: Path, tgt_path: Path, max_words: int, max_ratio: float) -> Iterator[Tuple[str, str]]:
    """Drops empty, over-long and badly length-mismatched training pairs (Moses clean-corpus style)."""
    with open(src_path, encoding="utf-8", errors="replace") as fs, \
            open(tgt_path, encoding="utf-8", errors="replace") as ft:
        for src, tgt in zip(fs, ft):
            src, tgt = " ".join(src.split()), " ".join(tgt.split())
            ls, lt = len(src.split()) or len(src), len(tgt.split()) or len(tgt)
            if not src or not tgt or ls > max_words or lt > max_words:
                continue
            if max(ls, lt) / max(1, min(ls, lt)) > max_ratio:
                continue
            yield src, tgt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--raw-dir", type=Path, required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--tgt", required=True)
    p.add_argument("--out-dir", type=Path, required=True)
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--max-words", type=int, default=250)
    p.add_argument("--max-ratio", type=float, default=9.0,
                   help="length ratio filter (characters for scripts without spaces)")
    p.add_argument("--spm-sentences", type=int, default=2_000_000, help="sentences sampled to train BPE")
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args(argv)
    raw, out = args.raw_dir, args.out_dir
    for split in ("train", "valid", "test"):
        for lang in (args.src, args.tgt):
            if not (raw / f"{split}.{lang}").is_file():
                p.error(f"{raw / f'{split}.{lang}'} is missing: run the download script first")
    out.mkdir(parents=True, exist_ok=True)
    kept = 0
    pairs = clean_pairs(raw / f"train.{args.src}", raw / f"train.{args.tgt}", args.max_words, args.max_ratio)
    with open(out / f"clean.{args.src}", "w", encoding="utf-8") as fs, \
            open(out / f"clean.{args.tgt}", "w", encoding="utf-8") as ft:
        for src, tgt in pairs:
            fs.write(src + "\n")
            ft.write(tgt + "\n")
            kept += 1
    print(f"[wmt] {kept} training pairs after cleaning", flush=True)
    coverage = 0.9995 if "zh" in (args.src, args.tgt) else 1.0
    spm.SentencePieceTrainer.train(input=[str(out / f"clean.{args.src}"), str(out / f"clean.{args.tgt}")],
                                   model_prefix=str(out / "spm"), vocab_size=args.vocab_size, model_type="bpe",
                                   character_coverage=coverage, input_sentence_size=args.spm_sentences,
                                   shuffle_input_sentence=True, minloglevel=2)
    processor = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    sources = {"train": "clean", "valid": None, "test": None}
    for split, prefix in sources.items():
        for lang in (args.src, args.tgt):
            path = out / f"{prefix}.{lang}" if prefix else raw / f"{split}.{lang}"
            lines = path.read_text(encoding="utf-8").splitlines()
            pieces = processor.encode(lines, out_type=str)
            (out / f"spm.{split}.{lang}").write_text("".join(" ".join(x) + "\n" for x in pieces), encoding="utf-8")
    subprocess.run([*tool_command("fairseq-preprocess"), "--source-lang", args.src, "--target-lang", args.tgt,
                    "--trainpref", str(out / "spm.train"), "--validpref", str(out / "spm.valid"),
                    "--testpref", str(out / "spm.test"), "--joined-dictionary", "--destdir", str(out / "data-bin"),
                    "--workers", str(args.workers)], check=True)
    print(f"[wmt] binarised data in {out / 'data-bin'}; sentencepiece model {out / 'spm.model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
