"""The rows of a results table: one trained model each, decoded and scored, compared with the row
it names, and the scoring cells every table writes."""

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Sequence, Tuple

from sacrebleu.metrics import BLEU

from ..analysis import scoring
from ..analysis.scoring import significance_mark
from ..tools.param_count import count_checkpoint_parameters
from . import fairseq_runs, length_penalty, stage_names
from .experiment import Stages


#: The converged comparison's Transformer from scratch, and continued from it: every other converged row, and the
#: compute-equivalence rows, are read against one of them.
CONVERGED_REFERENCE = "converged-baseline-s1"
CONTINUED_REFERENCE = "continued-baseline"


@dataclass(frozen=True)
class Row:
    """One trained model of the table."""

    name: str
    system: str
    protocol: str  # "scratch", "warm", "time" (equal wall-clock), "converged" or "continued"
    seed: int
    reference: str  # the row it is compared with
    flags: Tuple[str, ...] = ()  # model flags of this row only (an ablation)
    max_update: int = 0  # its own --max-update (equal wall-clock rows); 0: its protocol's


def published_rows(payload: Dict[str, object]) -> List[Row]:
    """The rows a published table's JSON lists, as its driver held them."""
    return [Row(**{**row, "flags": tuple(row["flags"])}) for row in payload["rows"]]


def compare(rows: List[Row], results: Dict[str, Dict[str, object]], hyp_file: Callable[[str], Path], raw_refs,
            num_test, tokenize: str = BLEU.TOKENIZER_DEFAULT, details: bool = True) -> None:
    """Adds delta BLEU, paired bootstrap p and the sign test against each row's reference (hypotheses of
    row ``name`` in ``hyp_file(name)``); with ``details`` also BLEU's n-gram precisions, brevity penalty
    and length ratio to every row, and the parameters each row adds to its reference's."""
    hyps = {name: scoring.align_hypotheses(scoring.read_generate_output(hyp_file(name)), num_test)[0]
            for name in results}
    if details:
        for name, res in results.items():
            res.update(scoring.bleu_details(hyps[name], raw_refs, tokenize))
    for row in rows:
        if row.name not in results or row.reference not in results or row.name == row.reference:
            continue
        ref, res = results[row.reference], results[row.name]
        boot = scoring.paired_bootstrap(hyps[row.reference], {row.name: hyps[row.name]}, raw_refs,
                                        tokenize=tokenize)[row.name]
        sign = scoring.sign_test(hyps[row.reference], hyps[row.name], raw_refs, tokenize)
        res.update(delta_bleu=round(res["bleu"] - ref["bleu"], 2), bootstrap_p=boot, sign_p=sign["p_value"],
                   sign_better=sign["better"], sign_worse=sign["worse"])
        if details and "params" in res:
            res["delta_params"] = res["params"] - ref["params"]


#: The titles of :func:`score_cells`' columns, for a table that scores other translations of the same rows
#: (checkpoint averages, tuned length penalty).
SCORE_HEADER = "| BLEU | Δ BLEU | BP (length) | chrF | bootstrap p | sign test p (better/worse) |"


def score_cells(res: Dict[str, object]) -> str:
    """BLEU (with its significance mark) to the sign test: the scoring columns of every table."""
    mark = significance_mark(res["bootstrap_p"]) if "bootstrap_p" in res else ""
    delta = f"{res['delta_bleu']:+.2f}" if "delta_bleu" in res else "–"
    boot = f"{res['bootstrap_p']:.3f}" if "bootstrap_p" in res else "–"
    sign = f"{res['sign_p']:.2g} ({res['sign_better']}/{res['sign_worse']})" if "sign_p" in res else "–"
    return (f"{res['bleu']:.2f}{mark} | {delta} | {res['brevity_penalty']:.2f} ({res['length_ratio']:.2f}) "
            f"| {res['chrf']:.2f} | {boot} | {sign}")


def tuned_table(rows: List[Row], results: Dict[str, Dict[str, object]], grid: Sequence[float],
                decoded: str = "") -> List[str]:
    """The rows whose length penalty was tuned on the validation split, as Markdown lines (none if no row was):
    each row's validation BLEU at fairseq's default length penalty and at its own, that value (``grid``: the
    values tried) and its test scores decoded with it (``decoded``: which checkpoint, for the title)."""
    tuned = [row for row in rows if "tuned" in results.get(row.name, {})]
    if not tuned:
        return []
    default = length_penalty.key(length_penalty.FAIRSEQ_LENPEN)
    out = [f"### Length penalty tuned on the validation split, each row on its own{decoded} (`--lenpen` from "
           f"{length_penalty.grid_text(grid)}; against the row named in its protocol's title, also tuned)",
           "",
           f"| row | valid BLEU at lenpen {default} → tuned | lenpen {SCORE_HEADER}",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in tuned:
        res = results[row.name]["tuned"]
        lenpen = length_penalty.key(res["lenpen"])
        before = res["valid_bleu"].get(default)
        before = "–" if before is None else f"{before:.2f}"
        out.append(f"| {row.name} | {before} → {res['valid_bleu'][lenpen]:.2f} | {lenpen} | {score_cells(res)} |")
    return out + [""]


def hypothesis_file(work: Path, name: str) -> Path:
    """Where the test hypotheses ``name`` lie: a row's (``{row}``, decoded at fairseq's default length penalty)
    or one of its variants' (``{row}.average``, ``{row}.lenpen``)."""
    return work / "translations" / f"{name}.txt"


@dataclass(frozen=True)
class Decoding:
    """What decoding and scoring a row's checkpoint needs: the binarised pair, fairseq's settings, the test
    split's references (and their count: hypotheses are aligned by id), the validation split's (to tune the length
    penalty) and sacrebleu's tokenisation."""
    data_bin: Path
    hp: Dict[str, object]
    raw_refs: Sequence[str]
    num_test: int
    valid_refs: Sequence[str] = ()
    tokenize: str = BLEU.TOKENIZER_DEFAULT


def score_row(row: Row, args: argparse.Namespace, decoding: Decoding, stages: Stages, checkpoint: Path,
              variant: str = "") -> Dict[str, object]:
    """Decodes the test split with ``checkpoint`` and scores it (``variant``: a suffix of the stage, file and log
    names when a row is scored with more than one checkpoint)."""
    work, hp, tokenize = args.workdir, decoding.hp, decoding.tokenize
    name = f"{row.name}{variant}"
    hyp_file = hypothesis_file(work, name)
    hyp_file.parent.mkdir(parents=True, exist_ok=True)

    def translate():
        speed = fairseq_runs.generate(decoding.data_bin, checkpoint, hyp_file, work / "logs" / f"generate-{name}.log",
                                      hp)
        hyps, missing = scoring.align_hypotheses(scoring.read_generate_output(hyp_file), decoding.num_test)
        return {"decode_sentences_per_s": speed, "untranslated_ids": missing,
                **scoring.corpus_scores(hyps, decoding.raw_refs, tokenize),
                "params": count_checkpoint_parameters(checkpoint)}

    return stages.run(stage_names.translate_and_score(row.name, variant), translate, hyp_file)


def tune_row(row: Row, args: argparse.Namespace, decoding: Decoding, stages: Stages, checkpoint: Path,
             decoded: Path) -> Dict[str, object]:
    """The row's length penalty tuned on the validation split, and its test scores decoded with it (BLEU with
    ``decoding``'s tokenisation on both splits). ``decoded``: the test split already decoded from ``checkpoint`` at
    ``decoding``'s length penalty (fairseq's default unless given); when the tuning keeps that value, those
    hypotheses are the tuned ones and the test split is not decoded again."""
    work, data_bin, hp, tokenize = args.workdir, decoding.data_bin, decoding.hp, decoding.tokenize
    hyp_file = hypothesis_file(work, f"{row.name}.lenpen")
    log = work / "logs" / f"generate-{row.name}.lenpen.log"

    def translate():
        tuned = length_penalty.tune(data_bin, checkpoint, args.lenpen_grid, hp, work / "translations" / "lenpen",
                                    row.name, decoding.valid_refs, tokenize)
        if tuned["lenpen"] == hp.get("lenpen", length_penalty.FAIRSEQ_LENPEN):
            shutil.copyfile(decoded, hyp_file)
            log.write_text(f"--lenpen {length_penalty.key(tuned['lenpen'])} is the default decoding's: "
                           f"{hyp_file.name} is a copy of {decoded}\n")
        else:
            fairseq_runs.generate(data_bin, checkpoint, hyp_file, log, dict(hp, lenpen=tuned["lenpen"]))
        hyps, missing = scoring.align_hypotheses(scoring.read_generate_output(hyp_file), decoding.num_test)
        return {**tuned, "untranslated_ids": missing, **scoring.corpus_scores(hyps, decoding.raw_refs, tokenize)}

    grid = length_penalty.grid_text(args.lenpen_grid, sep=",")
    return stages.run(f"tune length penalty {row.name} over {grid}", translate, hyp_file)


class Prepared(NamedTuple):
    """What every table trains and scores on (the binarised pair, fairseq's settings, the references), and its
    captions' common parts."""
    decoding: Decoding
    caption_head: str  # the test split and the shape
    caption_tail: str  # the device, the beam and sacrebleu's tokenisation where not its default
