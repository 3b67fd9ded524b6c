"""The Markdown of the paper's Table 1 and of its peers table: one table per protocol, pending rows as pending.

:mod:`.table1` trains and scores the rows; every table here is a function of their results (and the flags
its titles name) alone, so a published JSON rebuilds its Markdown exactly.
"""

import argparse
from typing import Dict, List, Optional

from .. import fairseq_runs
from . import report
from ..rows import SCORE_HEADER, Row, score_cells, tuned_table


def valid_cell(valid: Optional[Dict[str, float]]) -> str:
    """The last validation loss of a row's training, bits per target token ("–" without its log)."""
    return "–" if valid is None else f"{valid['loss']:.3f}"


def format_tables(rows: List[Row], results: Dict[str, Dict[str, object]], caption: str,
                  args: argparse.Namespace) -> str:
    """Table 1 or the peers in Markdown: one table per protocol, pending rows listed as pending."""
    header = ("| row | model | seed | updates | params | updates/s | train (s) | grad norm | clipped | valid loss "
              f"{SCORE_HEADER}\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    titles = {"scratch": "From scratch, equal updates (against `scratch-baseline-s1`)",
              "warm": "Warm start from `scratch-baseline-s1`, equal further updates (against `warm-baseline`)",
              "time": f"From scratch, equal wall-clock: the time of the baseline's {args.max_update} updates, the "
                      f"updates fixed from the training-speed ratios of `{args.speed_json[0]}` "
                      "(against `scratch-baseline-s1`)"}
    out = [caption, ""]
    for protocol in dict.fromkeys(row.protocol for row in rows):
        out += [f"### {titles[protocol]}", "", header]
        for row in (r for r in rows if r.protocol == protocol):
            label = fairseq_runs.label(row.system) + (f" ({' '.join(row.flags)})" if row.flags else "")
            res = results.get(row.name)
            if res is None:
                out.append(f"| {row.name} | {label} | {row.seed} | pending |  |  |  |  |  |  |  |  |  |  |  |  |")
                continue
            params = (f"{res['params'] / 1e6:.2f}M" if "delta_params" not in res
                      else f"+{res['delta_params'] / 1e6:.2f}M")
            out.append(f"| {row.name} | {label} | {row.seed} | {res['updates']} | {params} "
                       f"| {res['updates_per_s']:.2f} | {res['train_seconds']:.0f} | {res['grad_norm']:.2f} "
                       f"| {res['clip_percent']:.0f}% | {valid_cell(res.get('valid'))} | {score_cells(res)} |")
        out.append("")
    out += tuned_table(rows, results, args.lenpen_grid)
    out.append("BLEU and chrF: sacrebleu on detokenised output of the test split; BP: BLEU's brevity penalty, "
               "(length): the hypotheses' length over the references'. † p < 0.01, * p < 0.05 "
               "(paired bootstrap, 1000 resamples, against the row named in the title). Sign test: two-sided "
               "binomial over sentences whose sentence-BLEU differs. Grad norm: fairseq's mean gradient norm "
               "before clipping (--clip-norm 1.0); clipped: share of updates clipped. Valid loss: label-smoothed "
               "cross-entropy on the validation split at the end of training, bits per target token (fairseq's log; "
               "`valid` in the JSON also has the nll). updates/s is wall-clock "
               "on this machine; `load_average` in the JSON says whether the CPU was shared while a row trained.")
    out += report.format_row_notes(results)
    return "\n".join(out) + "\n"
