"""Joint sentencepiece subwords for source and target."""

from pathlib import Path
from typing import Iterable, Optional

import sentencepiece as spm

from ..tools.evaluation import read_lines

from .corpus import LANGS, SPLITS


def train_sentencepiece(corpus: Path, model_prefix: Path, vocab_size: int, max_sentences: int = 1_000_000) -> Path:
    """Trains one BPE model on the English and German training sides together."""
    spm.SentencePieceTrainer.train(
        input=[str(corpus / f"train.{lang}") for lang in LANGS],
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=1.0,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        num_threads=2,
        minloglevel=2,
    )
    return model_prefix.with_suffix(".model")


def encode_corpus(corpus: Path, model: Path, dest: Path, max_train_tokens: int,
                  limits: Optional[dict] = None) -> dict:
    """Encodes every split; training pairs longer than ``max_train_tokens`` on either side are dropped.

    Valid and test keep every sentence, so scores cover the whole test set.

    Returns:
        the number of pairs written per split.
    """
    processor = spm.SentencePieceProcessor(model_file=str(model))
    dest.mkdir(parents=True, exist_ok=True)
    written = {}
    for split in SPLITS:
        limit = (limits or {}).get(split)
        sides = {lang: processor.encode(read_lines(corpus / f"{split}.{lang}")[:limit], out_type=str)
                 for lang in LANGS}
        keep: Iterable[int] = range(len(sides["en"]))
        if split == "train":
            keep = [i for i in keep if 0 < len(sides["en"][i]) <= max_train_tokens
                    and 0 < len(sides["de"][i]) <= max_train_tokens]
        keep = list(keep)
        for lang in LANGS:
            with open(dest / f"{split}.{lang}", "w", encoding="utf-8") as f:
                f.writelines(" ".join(sides[lang][i]) + "\n" for i in keep)
        written[split] = len(keep)
    return written
