"""Beam search's length penalty, tuned on the validation split for each model.

fairseq ranks finished hypotheses by their log-probability divided by length ** lenpen
(``--lenpen``, 1.0 by default: the mean per-token log-probability). A system that translates
too short is not necessarily worse at choosing words; tuning ``--lenpen`` on the validation
split, for every system on its own, separates the two before the test split is read.
"""

from pathlib import Path
from typing import Dict, Sequence

from sacrebleu.metrics import BLEU

from ..analysis import scoring
from . import fairseq_runs

#: fairseq-generate's own ``--lenpen`` default; ties on the validation split go to the value nearest it.
FAIRSEQ_LENPEN = 1.0


def key(lenpen: float) -> str:
    """How a length penalty is written in file names, stage names, tables and JSON keys ("1", "1.5")."""
    return f"{lenpen:g}"


def best_length_penalty(valid_bleu: Dict[float, float]) -> float:
    """The length penalty with the highest validation BLEU; among equal scores, the one nearest
    fairseq's default (so a flat curve keeps the decoding every other table uses)."""
    return max(valid_bleu, key=lambda lenpen: (valid_bleu[lenpen], -abs(lenpen - FAIRSEQ_LENPEN)))


def tune(data_bin: Path, checkpoint: Path, grid: Sequence[float], hparams: Dict[str, object],
         out_dir: Path, name: str, references: Sequence[str],
         tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, object]:
    """Decodes the ``valid`` split once per value of ``grid`` and scores each against ``references``
    (BLEU with sacrebleu's ``tokenize``).

    Returns ``{"lenpen": best, "valid_bleu": {str(lenpen): BLEU}}``; the hypotheses and logs stay
    in ``out_dir`` as ``{name}.valid.lenpen{value}.{txt,log}``.
    """
    valid_bleu: Dict[float, float] = {}
    for lenpen in grid:
        stem = f"{name}.valid.lenpen{key(lenpen)}"
        hyp_file, log = out_dir / f"{stem}.txt", out_dir / f"{stem}.log"
        fairseq_runs.generate(data_bin, checkpoint, hyp_file, log, dict(hparams, lenpen=lenpen), subset="valid")
        hyps, _ = scoring.align_hypotheses(scoring.read_generate_output(hyp_file), len(references))
        valid_bleu[lenpen] = scoring.corpus_scores(hyps, references, tokenize)["bleu"]
    return {"lenpen": best_length_penalty(valid_bleu),
            "valid_bleu": {key(lenpen): bleu for lenpen, bleu in valid_bleu.items()}}
