"""Each method's ΔBLEU under every protocol measured, one row per method: does what it gained after one epoch
hold on a trained Transformer?

Read from the En->De tables published in ``docs/results`` (the paper's Table 1, the two peers tables and the
converged comparison): the README's by-method table is this output (tested to match). A second table
gives the same differences at each row's own length penalty, tuned on the validation split, for the protocols
whose tables tuned their rows.
``python -m fairseq_capsagg.pipeline.by_method`` prints it, ``--write README.md`` replaces the table between
the page's ``<!-- by-method:begin/end -->`` markers.
"""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..analysis.scoring import significance_mark
from ..tools.markdown_block import block_cli
from . import fairseq_runs, length_penalty

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"

#: The converged comparison's runs, oldest first: each lost its machine after the rows it published, and the
#: next trained everything again from a converged Transformer of its own (docs/results.md).
CONVERGED_RUNS = ("converged-cpu.json", "converged-run2/converged-cpu.json", "converged-run3/converged-cpu.json")
#: The En->De tables, in the order a row's first publication is taken from (the peers tables repeat
#: Table 1's EM routing and Transformer rows; each converged run repeats the earlier runs' rows and scores the
#: ones they left pending).
SOURCES = ("table1-cpu.json", "peers-cpu.json", "streams/peers-cpu.json", *CONVERGED_RUNS)


@dataclass(frozen=True)
class Column:
    """One protocol's ΔBLEU: from the best checkpoint (``best``), from the last five averaged (``average``), or
    decoded at the row's own length penalty tuned on the validation split (``tuned``)."""

    protocol: str
    variant: str = "best"


COLUMNS = (Column("scratch"), Column("warm"), Column("continued"), Column("continued", "average"),
           Column("converged"))
#: The second table's: every protocol at the rows' tuned length penalties (a column once any row has them).
TUNED_COLUMNS = tuple(Column(protocol, "tuned") for protocol in ("scratch", "warm", "continued", "converged"))

#: The converged comparison's protocols: every row it runs is a method of the table, ablations too (EM routing
#: on the encoder only); elsewhere ablations stay in their own tables.
CONVERGED_PROTOCOLS = ("continued", "converged")


@dataclass(frozen=True)
class Entry:
    """One publication of a row: where it stands in the table, its result and its reference's in the same table
    (None: pending)."""

    name: str
    source: str  # the published JSON, relative to the results folder
    system: str
    method: str  # the row's name without its protocol and seed: "emrouting-encoder", "baseline"
    label: str
    protocol: str
    seed: int
    reference: str
    ablation: bool
    result: Optional[Dict[str, object]]
    reference_result: Optional[Dict[str, object]]
    failed: bool


def scores(result: Dict[str, object], variant: str) -> Optional[Dict[str, object]]:
    """A published result's scores in ``variant`` (:class:`Column`): the result itself, its last five
    checkpoints averaged or its tuned length penalty's; None where it was not scored so."""
    return result if variant == "best" else result.get(variant)


def method_of(name: str, protocol: str, seed: int) -> str:
    """``scratch-dyncomb-s2`` -> ``dyncomb``; ``warm-emrouting-encoder`` -> ``emrouting-encoder``."""
    return name.removeprefix(f"{protocol}-").removesuffix(f"-s{seed}")


def read_entries(results_dir: Path) -> Tuple[List[Entry], Dict[str, Dict[str, object]], List[str]]:
    """Every publication of every row in the order of :data:`SOURCES`, each table's config by protocol (the
    first table's), and the length-penalty grids the tables that tuned rows tried ("0.5, 1, 1.5, 2, 3")."""
    entries: List[Entry] = []
    configs: Dict[str, Dict[str, object]] = {}
    grids: List[str] = []
    for source in SOURCES:
        path = results_dir / source
        if not path.exists():
            continue
        payload = json.loads(path.read_text())
        if any("tuned" in result for result in payload["results"].values()):
            grid = length_penalty.grid_text(payload["lenpen_grid"])
            grids += [grid] if grid not in grids else []
        for row in payload["rows"]:
            configs.setdefault(row["protocol"], payload["config"])
            label = fairseq_runs.label(row["system"]).removeprefix("+ ")
            entries.append(Entry(
                name=row["name"], source=source, system=row["system"],
                method=method_of(row["name"], row["protocol"], row["seed"]),
                label=label + (f" (`{' '.join(row['flags'])}`)" if row["flags"] else ""),
                protocol=row["protocol"], seed=row["seed"], reference=row["reference"], ablation=bool(row["flags"]),
                result=payload["results"].get(row["name"]), reference_result=payload["results"].get(row["reference"]),
                failed=row["name"] in payload.get("failures", {})))
    return entries, configs, grids


def chosen(publications: List[Entry], variant: str) -> List[Entry]:
    """One entry per row name and protocol, the one its cells read: its first publication scored in
    ``variant``, else its first pending one (a later run will score it), else its first failed one, else its
    first (scored, not in ``variant``)."""
    groups: Dict[Tuple[str, str], List[Entry]] = {}
    for entry in publications:
        groups.setdefault((entry.name, entry.protocol), []).append(entry)

    def first(group: List[Entry], wanted: Callable[[Entry], bool]) -> Optional[Entry]:
        return next((e for e in group if wanted(e)), None)

    return [first(group, lambda e: e.result is not None and scores(e.result, variant) is not None)
            or first(group, lambda e: e.result is None and not e.failed) or first(group, lambda e: e.failed)
            or group[0] for group in groups.values()]


def header(column: Column, configs: Dict[str, Dict[str, object]]) -> str:
    """A column's title, its updates read from its table's config."""
    config = configs[column.protocol]
    if column.protocol == "scratch":
        return f"one epoch: from scratch, {config['max_update']:,} updates"
    if column.protocol == "warm":
        return f"one epoch: +{config['warm_updates']:,} from the {config['max_update']:,}-update Transformer"
    if column.protocol == "continued":
        return ("the same, last 5 averaged" if column.variant == "average"
                else f"converged: +{config['warm_updates']:,} from the converged Transformer")
    return f"converged: from scratch (patience {config['patience_updates']:,}, cap {config['update_cap']:,})"


def delta_cell(entry: Entry, variant: str) -> str:
    """``+2.96†``: the entry's ΔBLEU against its reference with its significance mark; pending, failed."""
    if entry.failed:
        return "failed"
    if entry.result is None:
        return "pending"
    result = scores(entry.result, variant)
    if result is None or result.get("delta_bleu") is None:
        return "–"
    return f"{result['delta_bleu']:+.2f}".replace("-", "−") + significance_mark(result["bootstrap_p"])


def reference_of(entries: List[Entry], protocol: str) -> Optional[Entry]:
    """The Transformer the methods of a protocol are measured against (the row most of them name)."""
    named = Counter(e.reference for e in entries if e.protocol == protocol and e.method != fairseq_runs.BASELINE)
    if not named:
        return None
    return next((e for e in entries if e.name == named.most_common(1)[0][0]), None)


def bleu_cell(entry: Optional[Entry], variant: str) -> str:
    """The BLEU of a row in ``variant``."""
    if entry is None:
        return "–"
    if entry.result is None:
        return "pending"
    result = scores(entry.result, variant)
    return "–" if result is None else f"{result['bleu']:.2f}"


def other_references(entries: List[Entry], references: Dict[str, Optional[Entry]], titles: Dict[str, str],
                     variant: str) -> List[str]:
    """Notes for the rows measured against another run of their protocol's Transformer than the one the first
    row shows (a table that trained its own, or the Transformer of a second seed)."""
    notes: Dict[Tuple[str, str, str, float], List[str]] = {}
    for entry in entries:
        shown = references.get(entry.protocol)
        if entry.method == fairseq_runs.BASELINE or shown is None or shown.result is None \
                or entry.reference_result is None or scores(shown.result, variant) is None \
                or scores(entry.reference_result, variant) is None:
            continue
        bleu = scores(entry.reference_result, variant)["bleu"]
        if (entry.reference, bleu) == (shown.name, scores(shown.result, variant)["bleu"]):
            continue
        labels = notes.setdefault((entry.protocol, entry.reference, entry.source, bleu), [])
        label = entry.label + (f" (seed {entry.seed})" if entry.seed != 1 else "")
        if label not in labels:
            labels.append(label)
    return [f"{', '.join(labels)} in \"{titles[protocol]}\": against `{reference}` of `{source}` (BLEU {bleu:.2f})."
            for (protocol, reference, source, bleu), labels in notes.items()]


def method_table(publications: List[Entry], configs: Dict[str, Dict[str, object]],
                 columns: List[Column]) -> List[str]:
    """| method | one ΔBLEU cell per column |: the Transformer's BLEU first, its second seed (the noise) last;
    seeds of one method joined by " / "; every method of the published tables listed, measured or not; then
    the notes on cells read against another Transformer."""
    readings = {variant: chosen(publications, variant) for variant in {c.variant for c in columns}}
    references = {c: reference_of(readings[c.variant], c.protocol) for c in columns}
    systems = list(dict.fromkeys(e.system for e in publications))
    methods: Dict[str, str] = {}
    for entry in sorted(publications, key=lambda e: systems.index(e.system)):  # a system's variants together
        if entry.method != fairseq_runs.BASELINE and (not entry.ablation or entry.protocol in CONVERGED_PROTOCOLS):
            methods.setdefault(entry.method, entry.label)
    lines = ["| method | " + " | ".join(header(c, configs) for c in columns) + " |",
             "|---|" + "---:|" * len(columns),
             "| Transformer: BLEU | " + " | ".join(bleu_cell(references[c], c.variant) for c in columns) + " |"]

    def cells(method: str, first_seed: int) -> str:
        out = []
        for column in columns:
            found = sorted((e for e in readings[column.variant] if e.method == method
                            and e.protocol == column.protocol and e.seed >= first_seed), key=lambda e: e.seed)
            out.append(" / ".join(delta_cell(e, column.variant) for e in found) or "–")
        return " | ".join(out)

    for method, label in methods.items():
        lines.append(f"| {label} | {cells(method, first_seed=1)} |")
    lines.append(f"| Transformer, second seed | {cells(fairseq_runs.BASELINE, first_seed=2)} |")
    notes = [note for variant in readings for note in other_references(
        readings[variant], {c.protocol: references[c] for c in columns if c.variant == variant},
        {c.protocol: header(c, configs) for c in columns if c.variant == variant}, variant)
        if variant != "average"]
    return lines + ([""] + notes if notes else [])


def by_method_table(results_dir: Path = RESULTS) -> str:
    """The by-method table of the best checkpoints (and the continued rows' averages), then, once a published
    table tuned its rows' length penalties, the same at those penalties, for the protocols whose rows have them."""
    publications, configs, grids = read_entries(results_dir)
    lines = method_table(publications, configs, [c for c in COLUMNS if c.protocol in configs])
    tuned = {e.protocol for e in publications if e.result is not None and "tuned" in e.result}
    columns = [c for c in TUNED_COLUMNS if c.protocol in tuned]
    if columns:
        lines += ["", f"At each row's own length penalty, tuned on the validation split (`--lenpen` from "
                      f"{' or '.join(grids)}), against its Transformer tuned alike:", ""]
        lines += method_table(publications, configs, columns)
    return "\n".join(lines) + "\n"


def cli_main(argv: Optional[List[str]] = None) -> None:
    block_cli("by-method", __doc__.splitlines()[0], by_method_table, RESULTS, argv)


if __name__ == "__main__":
    cli_main()
