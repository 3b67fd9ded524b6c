"""The results table in the form of the paper's Table 1 (Markdown and JSON)."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ...analysis.scoring import significance_mark
from .. import fairseq_runs, provenance


def format_markdown(rows: List[Dict[str, object]], caption: str) -> str:
    """The main job's table in Markdown: the first row is the reference of every Δ."""
    lines = [
        "| # | model | updates | # params | train (updates/s) | train (tgt tok/s) | train time (s) "
        "| decode (sent/s) | BLEU | Δ BLEU | chrF | bootstrap p | sign test p |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base_params = rows[0]["params"]
    for i, row in enumerate(rows, 1):
        params = f"{row['params'] / 1e6:.2f}M" if i == 1 else f"+{(row['params'] - base_params) / 1e6:.2f}M"
        delta = "–" if row.get("delta_bleu") is None else f"{row['delta_bleu']:+.2f}"
        mark = significance_mark(row["bootstrap_p"]) if row.get("bootstrap_p") is not None else ""
        boot = "–" if row.get("bootstrap_p") is None else f"{row['bootstrap_p']:.4f}"
        sign = "–" if row.get("sign_p") is None else f"{row['sign_p']:.2g} ({row['sign_better']}/{row['sign_worse']})"
        lines.append(
            f"| {i} | {row['label']} | {row['updates']} | {params} | {row['updates_per_s']:.2f} "
            f"| {row['target_tokens_per_s']:.0f} | {row['train_seconds']:.0f} | {row['decode_sentences_per_s']:.2f} "
            f"| {row['bleu']:.2f}{mark} | {delta} | {row['chrf']:.2f} | {boot} | {sign} |"
        )
    notes = ("\nBLEU and chrF: sacrebleu, detokenised, on the test split. † p < 0.01, * p < 0.05 "
             "(paired bootstrap, 1000 resamples, against row 1). Sign test: two-sided binomial over "
             "sentences whose sentence-BLEU differs from the baseline's (better/worse).")
    return f"{caption}\n\n" + "\n".join(lines) + "\n" + notes + "\n"


def format_untranslated(results: Dict[str, Dict[str, object]]) -> str:
    """The test sentences a table scores as empty hypotheses, with the rows that do (empty: none).

    ``fairseq-generate`` returns no hypothesis for a sentence longer than the model takes, and, at fairseq's
    default ``--required-batch-size-multiple`` of 8, for the last, longest batch of a split when it is
    smaller (fairseq issue #5036): the drivers decode with 1 now, and tables decoded before still say so."""
    rows_by_ids: Dict[Tuple[int, ...], List[str]] = {}
    for name, res in results.items():
        if res.get("untranslated_ids"):
            rows_by_ids.setdefault(tuple(res["untranslated_ids"]), []).append(f"`{name}`")
    if not rows_by_ids:
        return ""

    def rows(names: List[str]) -> str:
        return "every row" if len(names) == len(results) else ", ".join(names)

    groups = "; ".join(f"{', '.join(map(str, ids))} in {rows(names)}" for ids, names in rows_by_ids.items())
    return ("Test sentences scored as empty hypotheses, for which fairseq-generate returned none (ids from 0; "
            "longer than the model takes, or left out with the last, longest batch at fairseq's default "
            f"`--required-batch-size-multiple` {fairseq_runs.FAIRSEQ_BATCH_MULTIPLE}, fairseq issue #5036): {groups}.")


def format_row_notes(results: Dict[str, Dict[str, object]]) -> List[str]:
    """The paragraphs under a table about its rows, each after an empty line: the code and machines that trained
    them (:func:`provenance.format_provenance`) and the test sentences scored as empty
    (:func:`format_untranslated`)."""
    out = []
    trained_by = provenance.format_provenance(results)
    if trained_by:
        out += [""] + trained_by
    untranslated = format_untranslated(results)
    if untranslated:
        out += ["", untranslated]
    return out


def format_step0(step0: Dict[str, Dict[str, float]], source: str = "row 1's checkpoint") -> str:
    """The step-0 table of warm starts from ``source``: each model's validation loss before any update."""
    lines = [f"Validation loss (base 2, per target token) at step 0 of a warm start from {source}:", "",
             "| model | loss | nll loss |", "|---|---:|---:|"]
    lines += [f"| {name} | {v['loss']:.4f} | {v['nll_loss']:.4f} |" for name, v in step0.items()]
    return "\n".join(lines) + "\n"


def write_report(rows: List[Dict[str, object]], workdir: Path, caption: str,
                 step0: Optional[Dict[str, Dict[str, float]]] = None,
                 sacrebleu: Optional[Dict[str, str]] = None) -> Path:
    """results.json (with sacrebleu's signatures) and results.md in ``workdir``."""
    (workdir / "results.json").write_text(json.dumps(
        {"caption": caption, "sacrebleu": sacrebleu, "rows": rows, "warm_start_step0": step0}, indent=2))
    path = workdir / "results.md"
    path.write_text(format_markdown(rows, caption) + ("\n" + format_step0(step0) if step0 else ""))
    return path
