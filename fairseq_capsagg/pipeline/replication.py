"""The converged comparison's two runs side by side: every row both runs scored, each against its own run's
reference, so that a difference can be read against how far the same row moves when its converged Transformer
is trained again on another machine (the first run's machine was lost with its checkpoints, and the second
run's Transformer is another network: docs/results.md, "The first run ends there").

``python -m fairseq_capsagg.pipeline.replication`` prints the table; ``--write docs/results.md`` replaces the
block between the page's ``<!-- replication:begin/end -->`` markers (a test keeps it current).
"""

import json
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..tools.markdown_block import block_cli
from .by_method import RESULTS

#: The first run's published table and the second's, relative to docs/results.
RUNS = ("converged-cpu.json", "converged-run2/converged-cpu.json")


def loss(result: Dict[str, object]) -> str:
    """The row's best validation loss (bits), as the table prints it."""
    return f"{result['best_loss']:.3f}"


def bleu(result: Dict[str, object]) -> str:
    """The row's BLEU (best checkpoint), as the table prints it."""
    return f"{result['bleu']:.2f}"


def delta(result: Dict[str, object]) -> str:
    """``+0.17 (0.102)``: ΔBLEU against the row's reference with its bootstrap p; "–" for a reference row."""
    if result.get("delta_bleu") is None:
        return "–"
    return f"{result['delta_bleu']:+.2f} ({result['bootstrap_p']:.3f})".replace("-", "−")


def search_errors(references: Dict[str, object]) -> str:
    """The share of test sentences whose reference the model scores above its hypothesis, in per cent."""
    return f"{100 * references['search_error_share']:.1f}%"


def curve_gaps(first: Dict[str, object], second: Dict[str, object]) -> List[Tuple[float, int]]:
    """``(|difference|, update)`` for every validation both rows logged: how far apart the same row's validation
    losses are, trained twice on the same data, settings and seed: by the machine's arithmetic, and by the
    batches stock fairseq drew again at each resume (patches.resumable_batches; docs/results.md)."""
    first_curve = {point["update"]: point["loss"] for point in first.get("curve", [])}
    return [(round(abs(point["loss"] - first_curve[point["update"]]), 3), point["update"])
            for point in second.get("curve", []) if point["update"] in first_curve]


def curve_gap(first: Dict[str, object], second: Dict[str, object]) -> str:
    """``0.016 (1000, 60)``: the largest of :func:`curve_gaps`, the update it falls on and how many validations
    both runs logged; "–" when they share none."""
    common = curve_gaps(first, second)
    if not common:
        return "–"
    gap, update = max(common)
    return f"{gap:.3f} ({update}, {len(common)})"


def both(first: Dict[str, object], second: Dict[str, object], cell: Callable[[Dict[str, object]], str]) -> str:
    """One measure of one row: ``first run / second run``."""
    return f"{cell(first)} / {cell(second)}"


def replication_table(results_dir: Path = RESULTS) -> str:
    """| row | each measure as "first run / second run" | how far apart the validation curves are |, in the first
    run's row order; a line saying what is missing while no row is scored by both."""
    paths = [results_dir / run for run in RUNS]
    if not all(path.is_file() for path in paths):
        return f"No table of the second run yet (`{RUNS[1]}`).\n"
    first_run, second_run = (json.loads(path.read_text()) for path in paths)
    first, second = first_run["results"], second_run["results"]
    names = [row["name"] for row in first_run["rows"] if row["name"] in first and row["name"] in second]
    if not names:
        return "No row is scored by both runs yet.\n"
    lines = ["| row | best valid loss | BLEU | Δ BLEU (bootstrap p) | last 5 averaged: BLEU | Δ BLEU (bootstrap p) "
             "| search errors | validation curves: largest gap (update, validations compared) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name in names:
        a, b = first[name], second[name]
        cells = [both(a, b, loss), both(a, b, bleu), both(a, b, delta), both(a["average"], b["average"], bleu),
                 both(a["average"], b["average"], delta), both(a["references"], b["references"], search_errors),
                 curve_gap(a, b)]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def cli_main(argv: Optional[List[str]] = None) -> None:
    block_cli("replication", __doc__.splitlines()[0], replication_table, RESULTS, argv)


if __name__ == "__main__":
    cli_main()
