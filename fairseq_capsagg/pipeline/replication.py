"""The converged comparison's runs side by side: every row two or more runs scored, each against its own run's
reference, so that a difference can be read against how far the same row moves when its converged Transformer
is trained again on another machine (each run's machine was lost with its checkpoints, and each run's
Transformer is another network: docs/results.md, "The first run ends there").

``python -m fairseq_capsagg.pipeline.replication`` prints the table; ``--write docs/results.md`` replaces the
block between the page's ``<!-- replication:begin/end -->`` markers (a test keeps it current).
"""

import json
from pathlib import Path
from itertools import combinations
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..tools.markdown_block import block_cli
from .by_method import CONVERGED_RUNS as RUNS
from .by_method import RESULTS

#: A cell of a run that has not scored the row (pending, or lost with its machine before it was scored).
UNSCORED = "·"


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


def curve_gap(results: Sequence[Dict[str, object]]) -> str:
    """``0.016 (1000, 60)``: the largest of :func:`curve_gaps` between any two of ``results`` (the same row of
    several runs), the update it falls on and how many validations those two runs both logged; "–" when no two
    share one."""
    gaps = [(*max(common), len(common)) for common in (curve_gaps(a, b) for a, b in combinations(results, 2))
            if common]
    if not gaps:
        return "–"
    gap, update, compared = max(gaps)
    return f"{gap:.3f} ({update}, {compared})"


def across(results: Sequence[Optional[Dict[str, object]]], cell: Callable[[Dict[str, object]], str]) -> str:
    """One measure of one row in every run, oldest first: ``first / second / ...``; :data:`UNSCORED` for a run
    that has not scored it."""
    return " / ".join(UNSCORED if result is None else cell(result) for result in results)


def replication_table(results_dir: Path = RESULTS) -> str:
    """| row | each measure as "first run / second run / ..." (one cell for each of :data:`RUNS`) | how far apart the
    validation curves are |, in the first run's row order (then the rows later runs added); a line saying what
    is missing while no row is scored by two runs."""
    paths = [results_dir / run for run in RUNS]
    published = [json.loads(path.read_text()) if path.is_file() else None for path in paths]
    if sum(run is not None for run in published) < 2:
        return f"No table of the second run yet (`{RUNS[1]}`).\n"
    names = list(dict.fromkeys(row["name"] for run in published if run for row in run["rows"]))
    scored = [[run["results"].get(name) if run else None for run in published] for name in names]
    table = [(name, results) for name, results in zip(names, scored) if sum(r is not None for r in results) >= 2]
    if not table:
        return "No row is scored by two runs yet.\n"
    lines = ["| row | best valid loss | BLEU | Δ BLEU (bootstrap p) | last 5 averaged: BLEU | Δ BLEU (bootstrap p) "
             "| search errors | validation curves: largest gap (update, validations compared) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, results in table:
        averages = [r and r["average"] for r in results]
        cells = [across(results, loss), across(results, bleu), across(results, delta), across(averages, bleu),
                 across(averages, delta), across([r and r["references"] for r in results], search_errors),
                 curve_gap([r for r in results if r is not None])]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def cli_main(argv: Optional[List[str]] = None) -> None:
    block_cli("replication", __doc__.splitlines()[0], replication_table, RESULTS, argv)


if __name__ == "__main__":
    cli_main()
