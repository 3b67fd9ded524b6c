"""Joint subwords for source and target: sentencepiece BPE, or subword-nmt BPE (the paper's).

Either way the model is learnt on both training sides together, applied to every split, and
the same model serves ``fairseq-generate`` (``--remove-bpe``), ``fairseq-interactive`` and the hub
(fairseq's own ``--bpe sentencepiece`` / ``--bpe subword_nmt``).
"""

import itertools
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional

import sentencepiece as spm

from ..analysis.scoring import read_lines
from .corpus import SPLITS, Pair

SUBWORD_METHODS = ("sentencepiece", "subword-nmt")
#: Languages written without spaces between words, whose many characters need sentencepiece's
#: character coverage below 1.0 (the rarest characters become <unk> instead of vocabulary).
CJK_LANGUAGES = frozenset({"zh", "ja", "ko"})
CJK_CHARACTER_COVERAGE = 0.9995


@dataclass(frozen=True)
class SubwordModel:
    """A learnt subword model: the file fairseq's ``--bpe`` reads, and how fairseq names it."""

    method: str
    path: Path

    @property
    def fairseq_bpe(self) -> str:
        """The value of fairseq's ``--bpe`` and ``--remove-bpe``."""
        return "sentencepiece" if self.method == "sentencepiece" else "subword_nmt"

    def fairseq_flags(self) -> List[str]:
        """``fairseq-interactive`` flags that encode raw input and decode the output."""
        model_flag = "--sentencepiece-model" if self.method == "sentencepiece" else "--bpe-codes"
        return ["--bpe", self.fairseq_bpe, model_flag, str(self.path)]

    def hub_kwargs(self) -> Dict[str, str]:
        """Keyword arguments of ``fairseq_capsagg.tools.hub.from_pretrained``."""
        model_key = "sentencepiece_model" if self.method == "sentencepiece" else "bpe_codes"
        return {"bpe": self.fairseq_bpe, model_key: str(self.path)}


def subword_model(method: str, directory: Path) -> SubwordModel:
    """Where the main job keeps the model of ``method`` (``spm/spm.model`` or ``bpe/bpe.codes``)."""
    if method == "sentencepiece":
        return SubwordModel(method, directory / "spm" / "spm.model")
    return SubwordModel(method, directory / "bpe" / "bpe.codes")


def character_coverage(pair: Pair) -> float:
    """1.0, or :data:`CJK_CHARACTER_COVERAGE` when either side is Chinese, Japanese or Korean."""
    return CJK_CHARACTER_COVERAGE if CJK_LANGUAGES & set(pair) else 1.0


#: Seeds the sample of both training sides that subwords are learnt from when they hold more than
#: ``max_sentences`` sentences (``--quick``), so a quick run learns the same subwords every time.
SAMPLE_SEED = 1


class VocabularyTooSmall(ValueError):
    """The sentencepiece vocabulary asked for cannot hold the corpus' characters."""

    def __init__(self, size: int, required: int, coverage: float):
        self.size, self.required = size, required
        super().__init__(f"--vocab-size {size} cannot hold the characters of this corpus: at character coverage "
                         f"{coverage:g} sentencepiece needs at least {required} pieces; use --vocab-size {required} "
                         "or more")


#: sentencepiece's refusal of a vocabulary smaller than the characters it must keep (and its own pieces).
_REQUIRED_CHARS = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _learn_sentencepiece(model: SubwordModel, sources: List[Path], pair: Pair, size: int, max_sentences: int,
                         grow_to_fit: bool) -> int:
    """A sentencepiece BPE vocabulary of ``size`` pieces (or, with ``grow_to_fit``, of the smallest size that
    holds the corpus' characters); returns the size learnt."""
    lines = [line for path in sources for line in read_lines(path)]
    # sentencepiece's own sample of a larger corpus differs from run to run, whatever its seed
    sample = random.Random(SAMPLE_SEED).sample(lines, max_sentences) if len(lines) > max_sentences else None

    def train(vocab_size: int) -> None:
        corpus_args = {"input": [str(path) for path in sources]} if sample is None else \
            {"sentence_iterator": iter(sample)}
        spm.SentencePieceTrainer.train(
            **corpus_args, model_prefix=str(model.path.with_suffix("")),
            vocab_size=vocab_size, model_type="bpe", character_coverage=character_coverage(pair),
            input_sentence_size=max_sentences, shuffle_input_sentence=True, num_threads=2, minloglevel=2)

    try:
        train(size)
        return size
    except RuntimeError as e:
        match = _REQUIRED_CHARS.search(str(e))
        if match is None:
            raise
        required = int(match.group(2))
        if not grow_to_fit:
            raise VocabularyTooSmall(size, required, character_coverage(pair)) from None
    train(required)
    return required


def _learn_subword_nmt(model: SubwordModel, sources: List[Path], size: int, max_sentences: int) -> int:
    """``size`` subword-nmt BPE merges from the first ``max_sentences`` lines of each source; returns ``size``."""
    from subword_nmt.learn_bpe import learn_bpe

    lines = itertools.chain.from_iterable(
        itertools.islice(read_lines(path), max_sentences) for path in sources)
    with open(model.path, "w", encoding="utf-8") as codes:
        learn_bpe((line + "\n" for line in lines), codes, size)
    return size


def learn(model: SubwordModel, corpus: Path, pair: Pair, size: int, max_sentences: int = 1_000_000,
          grow_to_fit: bool = False) -> int:
    """Learns ``model`` jointly on both training sides: a sentencepiece BPE vocabulary of ``size``
    pieces, or ``size`` subword-nmt merges.

    Returns:
        the size learnt: ``size``, or with ``grow_to_fit`` (``--quick``) the smallest sentencepiece
        vocabulary that holds the corpus' characters when ``size`` is below it.

    Raises:
        VocabularyTooSmall: ``size`` is below that smallest vocabulary (without ``grow_to_fit``).
    """
    model.path.parent.mkdir(parents=True, exist_ok=True)
    sources = [corpus / f"train.{lang}" for lang in pair]
    if model.method == "sentencepiece":
        return _learn_sentencepiece(model, sources, pair, size, max_sentences, grow_to_fit)
    return _learn_subword_nmt(model, sources, size, max_sentences)


def segmenter(model: SubwordModel):
    """A function from a raw sentence to its subword tokens."""
    if model.method == "sentencepiece":
        processor = spm.SentencePieceProcessor(model_file=str(model.path))
        return lambda line: processor.encode(line, out_type=str)
    from subword_nmt.apply_bpe import BPE

    with open(model.path, encoding="utf-8") as codes:
        bpe = BPE(codes)
    return lambda line: bpe.process_line(line).split()


def encode_corpus(model: SubwordModel, corpus: Path, pair: Pair, dest: Path, max_train_tokens: int,
                  limits: Optional[dict] = None) -> dict:
    """Encodes every split; training pairs longer than ``max_train_tokens`` on either side are dropped.

    Valid and test keep every sentence, so scores cover the whole test set.

    Returns:
        the number of pairs written per split.
    """
    segment = segmenter(model)
    dest.mkdir(parents=True, exist_ok=True)
    written = {}
    for split in SPLITS:
        limit = (limits or {}).get(split)
        sides = {lang: [segment(line) for line in read_lines(corpus / f"{split}.{lang}")[:limit]] for lang in pair}
        keep: Iterable[int] = range(len(sides[pair[0]]))
        if split == "train":
            keep = [i for i in keep if all(0 < len(sides[lang][i]) <= max_train_tokens for lang in pair)]
        keep = list(keep)
        for lang in pair:
            with open(dest / f"{split}.{lang}", "w", encoding="utf-8") as f:
                f.writelines(" ".join(sides[lang][i]) + "\n" for i in keep)
        written[split] = len(keep)
    return written
