"""Results at a glance, read from published tables: one row per method with its ΔBLEU after one epoch, its ΔBLEU
continued from a converged Transformer, and its compute-equivalence from scratch; and the converged comparison's
runs in one table, every row against its own run's Transformer.

Every path is an argument (``make tables`` passes the published ones)::

    python -m fairseq_capsagg.pipeline.reports.summary glance --one-epoch T.json ... --converged C.json ... \
        --equivalence E.json [--write README.md]
    python -m fairseq_capsagg.pipeline.reports.summary converged-runs --converged C.json ... [--write docs/results.md]
    python -m fairseq_capsagg.pipeline.reports.summary equivalence --equivalence E.json [--write docs/results.md]

``--write PAGE`` replaces the page's ``<!-- glance:begin/end -->`` (``converged-runs``, ``equivalence``) block.
"""

import argparse
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...analysis.scoring import significance_mark
from ...tools.markdown_block import write_block
from ...aggregators import architecture_defaults
from .. import equivalence, fairseq_runs
from ..rows import published_rows
from .equivalence_report import format_body, span

Table = Dict[str, object]
#: The one-epoch ablations kept as methods: EM routing on the encoder only was continued from the converged
#: Transformer too (the paper's Table 5 ablation); the others stay in their own tables.
METHOD_FLAGS = {("--decoder-aggregation", "none"): "encoder only"}
NOT_MEASURED = "not measured"


def read(paths: Sequence[Path]) -> List[Tuple[str, Table]]:
    """Each published JSON with the name the tables cite it by (its path as given)."""
    return [(str(path), json.loads(Path(path).read_text())) for path in paths]


def names_architecture_defaults(row: Dict[str, object]) -> bool:
    """Whether the row's flags only set what its system's architectures set today (``--output-capsules 8`` once
    dynamic routing's architectures use 8): the method as a user gets it, named explicitly."""
    flags = row["flags"]
    if not flags or len(flags) % 2 or row["system"] == fairseq_runs.BASELINE:
        return False
    defaults = architecture_defaults(row["system"])
    return all(flag.startswith("--") and flag[2:].replace("-", "_") in defaults
               and str(defaults[flag[2:].replace("-", "_")]) == value for flag, value in zip(flags[::2], flags[1::2]))


def method_of(row: Dict[str, object]) -> Optional[Tuple[str, str]]:
    """(system, variant) of a row that measures a method (its defaults, or an ablation kept as a method); None for
    an ablation that is not one."""
    flags = tuple(row["flags"])
    if flags and flags not in METHOD_FLAGS and not names_architecture_defaults(row):
        return None
    return row["system"], METHOD_FLAGS.get(flags, "")


def method_label(method: Tuple[str, str]) -> str:
    system, variant = method
    label = fairseq_runs.label(system).removeprefix("+ ")
    return f"{label}, {variant}" if variant else label


def delta(result: Dict[str, object], with_p: bool = False) -> str:
    """``+2.96†`` (``with_p``: ``+0.24* (0.021)``); "–" without a difference."""
    if result.get("delta_bleu") is None:
        return "–"
    text = f"{result['delta_bleu']:+.2f}".replace("-", "−") + significance_mark(result["bootstrap_p"])
    return f"{text} ({result['bootstrap_p']:.3f})" if with_p else text


def scored_rows(tables: List[Tuple[str, Table]], protocol: str):
    """(source, row, result) of every scored row of ``protocol``, first publication of a row name only."""
    seen = set()
    for source, table in tables:
        for row in table["rows"]:
            result = table["results"].get(row["name"])
            if row["protocol"] == protocol and result is not None and (source, row["name"]) not in seen:
                seen.add((source, row["name"]))
                yield source, row, result


def against(cell: str, reference_bleu: float, header_bleu: float) -> str:
    """``cell`` with the BLEU of the reference it was measured against where that is not the header's (a row of
    another run: ``+3.02† vs 7.44``)."""
    return cell if round(reference_bleu, 2) == round(header_bleu, 2) else f"{cell} vs {reference_bleu:.2f}"


def one_epoch_cells(tables: List[Tuple[str, Table]], header_bleu: float) -> Dict[Tuple[str, str], str]:
    """Each method's ΔBLEU from scratch (both seeds where two were trained: ``+2.96† / +3.11†``), against its own
    table's Transformer (:func:`against`). Rows that name the architectures' current defaults
    (:func:`names_architecture_defaults`) stand for their method in place of rows trained without flags, which ran
    the defaults of their day."""
    cells: Dict[Tuple[str, str], List[Tuple[bool, int, str]]] = {}
    seen = set()
    by_source = dict(tables)
    for source, row, result in scored_rows(tables, "scratch"):
        method = method_of(row)
        if method is None or row["name"] in seen or row["name"] == row["reference"]:
            continue
        seen.add(row["name"])
        reference = by_source[source]["results"][row["reference"]]["bleu"]
        cells.setdefault(method, []).append((names_architecture_defaults(row), row["seed"],
                                             against(delta(result), reference, header_bleu)))
    out = {}
    for method, found in cells.items():
        named = any(explicit for explicit, _, _ in found)
        out[method] = " / ".join(cell for explicit, _, cell in sorted(found) if explicit or not named)
    return out


def converged_cells(tables: List[Tuple[str, Table]], header_bleu: float) -> Dict[Tuple[str, str], str]:
    """Each method's ΔBLEU of its last checkpoints averaged, continued from the trained Transformer, against the
    Transformer continued alike in the same run (seed 1; the first run that scored it; :func:`against`)."""
    cells = {}
    by_source = dict(tables)
    for source, row, result in scored_rows(tables, "continued"):
        method = method_of(row)
        if method is None or row["seed"] != 1 or method in cells or row["system"] == fairseq_runs.BASELINE:
            continue
        reference = by_source[source]["results"][row["reference"]]["average"]["bleu"]
        cells[method] = against(delta(result["average"], with_p=True), reference, header_bleu)
    return cells


def equivalence_cells(table: Optional[Table]) -> Dict[Tuple[str, str], str]:
    """Each system's compute-equivalence at its last point: with the Transformer's seeds measured, its mean over
    its seeds, the span over every seed and run, and whether that span lies above, within or below the seed band
    (``1.25 (1.20-1.31, 2 seeds), above``); without, the span of its one row over the Transformer runs against the
    runs' own band (``1.31-1.42, above``)."""
    if table is None:
        return {}
    measured = table["compute_equivalence"]
    if measured.get("seed_band"):
        return {(system, ""): seed_cell(points[-1]) for system, points in measured["systems"].items()
                if points[-1]["mean"] is not None}
    band = {int(u): b for u, b in measured["noise_band"].items()}
    cells = {}
    for row in table["rows"]:
        points = measured["rows"].get(row["name"])
        if not points or points[-1]["updates_ratio"] is None:
            continue
        last = points[-1]
        faster, slower = equivalence.faster(last, band), equivalence.slower(last, band)
        verdict = "" if faster is None else ", above" if faster else ", below" if slower else ", within"
        cells[(row["system"], "")] = span(last["updates_ratio"]) + verdict
    return cells


def seed_cell(point: Dict[str, object]) -> str:
    """One system's point of :func:`~..equivalence.seed_summary` as a glance cell."""
    verdict = ("" if point["above"] is None else ", above" if point["above"] else ", below" if point["below"]
               else ", within")
    count = len(point["seeds"])
    mean, spread = f"{point['mean']:.2f}", span(point["span"])
    spread = "" if spread == mean else f"{spread}, "  # one seed whose runs agree: its span is its mean
    return f"{mean} ({spread}{count} seed{'s' if count > 1 else ''}){verdict}"


def noise_line(one_epoch: List[Tuple[str, Table]], converged: List[Tuple[str, Table]],
               equivalence_table: Optional[Table] = None) -> str:
    """The Transformer's own noise: its second seed in each protocol, its converged runs' BLEU side by side, and
    its seeds from scratch placed on those runs' curves at the compute-equivalence table's last point (the seed
    band), where trained."""
    seeds = {}
    for protocol, tables in (("scratch", one_epoch), ("continued", converged)):
        for _, row, result in scored_rows(tables, protocol):
            if row["system"] == fairseq_runs.BASELINE and row["seed"] == 2 and protocol not in seeds:
                seeds[protocol] = result if protocol == "scratch" else result["average"]
    runs = [table["results"][equivalence.REFERENCE] for _, table in converged
            if equivalence.REFERENCE in table["results"] and not table["results"][equivalence.REFERENCE].get("snapshot")]
    parts = []
    if "scratch" in seeds:
        parts.append(f"the Transformer's second seed {delta(seeds['scratch'], with_p=True)} after one epoch")
    if "continued" in seeds:
        parts.append(f"{delta(seeds['continued'], with_p=True)} continued (last 5 averaged)")
    if len(runs) > 1:
        best = " and ".join(f"{r['bleu']:.2f}" for r in runs)
        averaged = " and ".join(f"{r['average']['bleu']:.2f}" for r in runs)
        parts.append(f"two trainings of the long-trained Transformer score {best} BLEU (last 5 averaged: {averaged})")
    measured = (equivalence_table or {}).get("compute_equivalence", {})
    if measured.get("seed_band"):
        last = max(measured["seed_band"], key=int)
        seeds = sorted(row["seed"] for row in equivalence_table["rows"] if row["system"] == fairseq_runs.BASELINE
                       and row["name"] in measured["rows"])
        parts.append(f"from scratch, its seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} and the "
                     f"runs' own lie at {span(measured['seed_band'][last])}x on those runs' curves at {int(last):,} "
                     "updates (compute-equivalence's seed band)")
    return "Noise: " + "; ".join(parts) + "."


def glance_table(one_epoch: Sequence[Path], converged: Sequence[Path], equivalence_json: Optional[Path]) -> str:
    """One row per method: ΔBLEU after one epoch, continued from the long-trained Transformer, and
    compute-equivalence; the Transformer's BLEU first, each cell measured against another run's Transformer with
    that run's BLEU, the noise under the table."""
    epoch_tables, converged_tables = read(one_epoch), read(converged)
    equivalence_table = read([equivalence_json])[0][1] if equivalence_json else None
    first = epoch_tables[0][1]
    base = first["results"][next(r["reference"] for r in first["rows"] if r["protocol"] == "scratch")]
    continued = converged_tables[0][1]["results"]["continued-baseline"]["average"]
    columns = [one_epoch_cells(epoch_tables, base["bleu"]), converged_cells(converged_tables, continued["bleu"]),
               equivalence_cells(equivalence_table)]
    methods = [m for m in dict.fromkeys(m for cells in columns for m in cells) if m[0] != fairseq_runs.BASELINE]
    order = fairseq_runs.systems()
    methods.sort(key=lambda m: (order.index(m[0]), m[1]))
    steps = first["config"]["max_update"], converged_tables[0][1]["config"]["warm_updates"]
    cap = equivalence_table["config"]["update_cap"] if equivalence_table else equivalence.UPDATE_CAP
    trained = converged_tables[0][1]["results"][equivalence.REFERENCE]
    start = ("the converged Transformer" if trained["converged"] else
             f"the Transformer trained {trained['stopped_at']:,} updates (not converged)")
    lines = [f"| method | one epoch: ΔBLEU, {steps[0]:,} updates from scratch | continued: ΔBLEU (p), +{steps[1]:,} "
             f"updates from {start}, last 5 averaged | compute-equivalence at {cap:,} updates from scratch |",
             "|---|---:|---:|---:|",
             f"| Transformer: BLEU | {base['bleu']:.2f} | {continued['bleu']:.2f} | 1 |"]
    for method in methods:
        cells = [c.get(method, NOT_MEASURED) for c in columns]
        lines.append(f"| {method_label(method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + noise_line(epoch_tables, converged_tables, equivalence_table) + "\n"


def converged_runs_table(converged: Sequence[Path]) -> str:
    """Every scored row of every converged run, each against its own run's reference: best checkpoint and the
    average of its last interval checkpoints (how many: a GPU run of 500 updates averages two)."""
    lines = ["| run | row | best valid loss | BLEU | ΔBLEU (p) | averaged checkpoints | BLEU | ΔBLEU (p) |",
             "|---|---|---:|---:|---:|---|---:|---:|"]
    for source, table in read(converged):
        for row in table["rows"]:
            result = table["results"].get(row["name"])
            if result is None:
                continue
            average = result["average"]
            updates = ", ".join(f"{u:,}" for u in average["updates"])
            name = row["name"] + (" (snapshot)" if result.get("snapshot") else "")
            lines.append(f"| `{source}` | {name} | {result['best_loss']:.3f} | {result['bleu']:.2f} "
                         f"| {delta(result, with_p=True)} | {updates} | {average['bleu']:.2f} "
                         f"| {delta(average, with_p=True)} |")
    return "\n".join(lines) + "\n"


def equivalence_table(equivalence_json: Path) -> str:
    """The published compute-equivalence table without its caption: every point of every measured row, the rows
    not measured once, the test scores."""
    payload = read([equivalence_json])[0][1]
    return format_body(published_rows(payload), payload["results"], payload["compute_equivalence"])


def cli_main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="summary", description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=("glance", "converged-runs", "equivalence"))
    parser.add_argument("--one-epoch", type=Path, nargs="+", default=[], help="published one-epoch tables (JSON)")
    parser.add_argument("--converged", type=Path, nargs="+", default=[], help="published converged tables (JSON)")
    parser.add_argument("--equivalence", type=Path, default=None, help="the published compute-equivalence JSON")
    parser.add_argument("--write", type=Path, default=None, help="replace the table's block in this Markdown page")
    args = parser.parse_args(argv)
    needs = {"glance": ("one_epoch", "converged"), "converged-runs": ("converged",), "equivalence": ("equivalence",)}
    missing = [name for name in needs[args.table] if not getattr(args, name)]
    if missing:
        parser.error(f"--{missing[0].replace('_', '-')}: required for the {args.table} table")
    text = (glance_table(args.one_epoch, args.converged, args.equivalence) if args.table == "glance"
            else converged_runs_table(args.converged) if args.table == "converged-runs"
            else equivalence_table(args.equivalence))
    if args.write:
        write_block(args.write, args.table, text)
    else:
        print(text, end="")


if __name__ == "__main__":
    cli_main()
