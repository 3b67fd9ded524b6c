"""Beam search's length penalty, tuned on the validation split for each model.

fairseq ranks finished hypotheses by their log-probability divided by length ** lenpen
(``--lenpen``, 1.0 by default: the mean per-token log-probability). A system that translates
too short is not necessarily worse at choosing words; tuning ``--lenpen`` on the validation
split, for every system on its own, separates the two before the test split is read.

Which hypotheses finish does not depend on ``--lenpen``: fairseq's beam advances on the
log-probabilities alone and only divides a hypothesis' score when it finishes (``finalize_hypos`` in
``fairseq/sequence_generator.py``), then returns the best of the beam-size finished ones. So one
decoding that prints them all (``--nbest`` = ``--beam``) holds the choice at every length penalty:
the grid costs one decoding of the validation split, not one per value.
"""

from pathlib import Path
from typing import Dict, List, Sequence

from sacrebleu.metrics import BLEU

from ..analysis import scoring
from . import fairseq_runs

#: fairseq-generate's own ``--lenpen`` default; ties on the validation split go to the value nearest it.
FAIRSEQ_LENPEN = 1.0


def key(lenpen: float) -> str:
    """How a length penalty is written in file names, stage names, tables and JSON keys ("1", "1.5")."""
    return f"{lenpen:g}"


def grid_text(grid: Sequence[float], sep: str = ", ") -> str:
    """A grid of length penalties as tables ("0.5, 1, 1.5") and stage names (``sep=","``) write it."""
    return sep.join(map(key, grid))


def best_length_penalty(valid_bleu: Dict[float, float]) -> float:
    """The length penalty with the highest validation BLEU; among equal scores, the one nearest
    fairseq's default (so a flat curve keeps the decoding every other table uses)."""
    return max(valid_bleu, key=lambda lenpen: (valid_bleu[lenpen], -abs(lenpen - FAIRSEQ_LENPEN)))


def rerank(nbest: Dict[int, List[scoring.Hypothesis]], lenpen: float,
           decoded_at: float = FAIRSEQ_LENPEN) -> Dict[int, scoring.Hypothesis]:
    """Beam search's choice at ``lenpen`` for every sentence, from its finished hypotheses decoded at
    ``decoded_at``: the highest log p(y|x) / |y| ** lenpen (|y|: tokens with EOS), the first of equal ones in
    fairseq's order, with its score at ``lenpen``."""
    def at_lenpen(hypothesis: scoring.Hypothesis) -> scoring.Hypothesis:
        log_prob = hypothesis.score * hypothesis.length ** decoded_at
        return hypothesis._replace(score=log_prob / hypothesis.length ** lenpen)

    return {sentence: max(map(at_lenpen, hypotheses), key=lambda h: h.score)
            for sentence, hypotheses in nbest.items()}


def tune(data_bin: Path, checkpoint: Path, grid: Sequence[float], hparams: Dict[str, object],
         out_dir: Path, name: str, references: Sequence[str],
         tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, object]:
    """Decodes the ``valid`` split once, every finished hypothesis kept, and scores beam search's choice at
    each value of ``grid`` (:func:`rerank`) against ``references`` (BLEU with sacrebleu's ``tokenize``).

    Returns ``{"lenpen": best, "valid_bleu": {str(lenpen): BLEU}}``; the decoding and its log stay in
    ``out_dir`` as ``{name}.valid.nbest.{txt,log}``, the choice at each value as ``{name}.valid.lenpen{value}.txt``
    (``D-`` lines, as fairseq-generate prints them).
    """
    nbest_file, log = out_dir / f"{name}.valid.nbest.txt", out_dir / f"{name}.valid.nbest.log"
    fairseq_runs.generate(data_bin, checkpoint, nbest_file, log, dict(hparams, lenpen=FAIRSEQ_LENPEN),
                          subset="valid", extra=["--nbest", str(hparams["beam"])])
    nbest = scoring.read_nbest(nbest_file)
    valid_bleu: Dict[float, float] = {}
    for lenpen in grid:
        chosen = rerank(nbest, lenpen)
        (out_dir / f"{name}.valid.lenpen{key(lenpen)}.txt").write_text(
            "".join(f"D-{i}\t{h.score}\t{h.text}\n" for i, h in sorted(chosen.items())), encoding="utf-8")
        hyps, _ = scoring.align_hypotheses({i: h.text for i, h in chosen.items()}, len(references))
        valid_bleu[lenpen] = scoring.corpus_scores(hyps, references, tokenize)["bleu"]
    return {"lenpen": best_length_penalty(valid_bleu),
            "valid_bleu": {key(lenpen): bleu for lenpen, bleu in valid_bleu.items()}}
