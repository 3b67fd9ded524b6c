"""Scoring translations: id alignment, BLEU/chrF and significance against a baseline."""

import re
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Tuple

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.significance import PairedTest
from scipy.stats import binomtest

_LINE = re.compile(r"^D-(\d+)\t([^\t]*)\t(.*)$")
_POSITIONS = re.compile(r"^P-(\d+)\t(.*)$")


class Hypothesis(NamedTuple):
    """One finished hypothesis of beam search as ``fairseq-generate`` prints it: detokenised ``text``, its
    ``score`` (log-probability, base 2, divided by ``length`` ** lenpen) and ``length`` (tokens, EOS included:
    one positional score each)."""
    text: str
    score: float
    length: int


def read_lines(path: Path) -> List[str]:
    """The lines of a text file, one per sentence (split on newlines only, no trailing empty line)."""
    lines = Path(path).read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def read_generate_output(path: Path) -> Dict[int, str]:
    """Detokenised hypotheses by sentence id from ``fairseq-generate`` output (``D-`` lines)."""
    hypotheses = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = _LINE.match(line.rstrip("\n"))
            if match:
                hypotheses[int(match.group(1))] = match.group(3)
    return hypotheses


def read_nbest(path: Path) -> Dict[int, List[Hypothesis]]:
    """Every hypothesis by sentence id, best first, from ``fairseq-generate --nbest`` output (each ``D-`` line
    with the ``P-`` line of positional scores that follows it)."""
    nbest: Dict[int, List[Hypothesis]] = {}
    scored = None  # the last D- line, until its P- line
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            text, positions = _LINE.match(line), _POSITIONS.match(line)
            if text:
                scored = (int(text.group(1)), float(text.group(2)), text.group(3))
            elif positions and scored is not None and scored[0] == int(positions.group(1)):
                sentence, score, words = scored
                nbest.setdefault(sentence, []).append(Hypothesis(words, score, len(positions.group(2).split())))
                scored = None
    return nbest


def align_hypotheses(hypotheses: Dict[int, str], num_sentences: int) -> Tuple[List[str], List[int]]:
    """Orders hypotheses by id; sentences fairseq skipped get an empty hypothesis.

    ``fairseq-generate`` prints in batch order and silently drops inputs longer than the model
    takes (``--skip-invalid-size-inputs-valid-test``) and, unless ``--required-batch-size-multiple``
    is 1, the split's last batch when it is smaller than that multiple, so lines must be matched by
    id, never by position.

    Returns:
        (one hypothesis per reference, the ids that had none).
    """
    unknown = sorted(i for i in hypotheses if not 0 <= i < num_sentences)
    if unknown:
        raise ValueError(f"hypothesis ids {unknown[:5]} are outside the {num_sentences} references")
    missing = [i for i in range(num_sentences) if i not in hypotheses]
    return [hypotheses.get(i, "") for i in range(num_sentences)], missing


#: sacrebleu's BLEU tokenizer for a target language; every other language gets sacrebleu's default.
BLEU_TOKENIZERS = {"zh": "zh"}


def bleu_tokenizer(target_lang: str) -> str:
    """``zh`` for a Chinese target, ``13a`` (sacrebleu's default, WMT's) otherwise."""
    return BLEU_TOKENIZERS.get(target_lang, BLEU.TOKENIZER_DEFAULT)


def signatures(tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, str]:
    """sacrebleu's signatures of the BLEU and chrF that :func:`corpus_scores` computes (one reference)."""
    metrics = {"bleu": BLEU(tokenize=tokenize), "chrf": CHRF()}
    for metric in metrics.values():
        metric.corpus_score(["."], [["."]])  # sacrebleu reads the number of references from a scoring
    return {name: str(metric.get_signature()) for name, metric in metrics.items()}


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str],
                  tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, float]:
    """Detokenised sacrebleu BLEU (with sacrebleu's ``tokenize``) and chrF."""
    bleu = BLEU(tokenize=tokenize).corpus_score(list(hypotheses), [list(references)])
    chrf = CHRF().corpus_score(list(hypotheses), [list(references)])
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2)}


def bleu_details(hypotheses: Sequence[str], references: Sequence[str],
                 tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, object]:
    """What a corpus BLEU is made of: its n-gram precisions (%), brevity penalty and the
    hypotheses' length over the references' (in BLEU's tokens)."""
    bleu = BLEU(tokenize=tokenize).corpus_score(list(hypotheses), [list(references)])
    return {"precisions": [round(p, 2) for p in bleu.precisions], "brevity_penalty": round(bleu.bp, 4),
            "length_ratio": round(bleu.sys_len / bleu.ref_len, 4)}


def sign_test(baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
              tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, float]:
    """The sign test used by the paper (Collins et al. 2005), on sentence-level BLEU.

    Counts the sentences a system translates better or worse than the baseline
    (ties are dropped) and returns the two-sided binomial p-value.
    """
    bleu = BLEU(effective_order=True, tokenize=tokenize)
    better = worse = 0
    for base, hyp, ref in zip(baseline, system, references):
        delta = bleu.sentence_score(hyp, [ref]).score - bleu.sentence_score(base, [ref]).score
        better += delta > 0
        worse += delta < 0
    p_value = binomtest(better, better + worse).pvalue if better + worse else 1.0
    return {"better": better, "worse": worse, "p_value": float(p_value)}


def paired_bootstrap(baseline: Sequence[str], systems: Dict[str, Sequence[str]],
                     references: Sequence[str], samples: int = 1000,
                     tokenize: str = BLEU.TOKENIZER_DEFAULT) -> Dict[str, float]:
    """sacrebleu's paired bootstrap resampling: p-value of each system against the baseline.

    A system whose BLEU equals the baseline's gets p = 1: sacrebleu counts resampled differences strictly
    above the observed one, so where every resample differs by the same amount (identical translations, or
    BLEU 0 for both) it returns its smallest p, 1 / (samples + 1), for a difference of exactly zero."""
    named = [("baseline", list(baseline))] + [(name, list(h)) for name, h in systems.items()]
    metric = BLEU(references=[list(references)], tokenize=tokenize)
    _, results = PairedTest(named, {"BLEU": metric}, references=None,
                            test_type="bs", n_samples=samples)()
    base = results["BLEU"][0].score
    return {name: 1.0 if r.score == base else float(r.p_value)
            for name, r in zip(results["System"][1:], results["BLEU"][1:])}


def significance_mark(p_value: float) -> str:
    """'†' for p < 0.01 as in the paper's Table 2, '*' for p < 0.05."""
    return "†" if p_value < 0.01 else "*" if p_value < 0.05 else ""
