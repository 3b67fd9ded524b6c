"""Each method's ΔBLEU under every protocol measured, one row per method: does what it gained after one epoch
hold on a trained Transformer?

Read from the En->De tables published in ``docs/results`` (the paper's Table 1, the two peers tables and the
converged comparison): the README's by-method table is this output (tested to match).
``python -m fairseq_capsagg.pipeline.by_method`` prints it, ``--write README.md`` replaces the table between
the page's ``<!-- by-method:begin/end -->`` markers.
"""

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..analysis.scoring import significance_mark
from ..tools.markdown_block import block_cli
from . import fairseq_runs

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
    """One protocol's ΔBLEU: from the best checkpoint, or (``average``) from the last five averaged."""

    protocol: str
    average: bool = False


COLUMNS = (Column("scratch"), Column("warm"), Column("continued"), Column("continued", average=True),
           Column("converged"))

#: The converged comparison's protocols: every row it runs is a method of the table, ablations too (EM routing
#: on the encoder only); elsewhere ablations stay in their own tables.
CONVERGED_PROTOCOLS = ("continued", "converged")


@dataclass(frozen=True)
class Entry:
    """One published row: where it stands in the table, its result and its reference's in the same table
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


def method_of(name: str, protocol: str, seed: int) -> str:
    """``scratch-dyncomb-s2`` -> ``dyncomb``; ``warm-emrouting-encoder`` -> ``emrouting-encoder``."""
    return name.removeprefix(f"{protocol}-").removesuffix(f"-s{seed}")


def read_entries(results_dir: Path) -> Tuple[List[Entry], Dict[str, Dict[str, object]]]:
    """Every row of the published tables (the first scored publication of each name and protocol, else the first
    pending or failed one), and each table's config by protocol."""
    entries: Dict[Tuple[str, str], Entry] = {}
    configs: Dict[str, Dict[str, object]] = {}
    for source in SOURCES:
        path = results_dir / source
        if not path.exists():
            continue
        payload = json.loads(path.read_text())
        for row in payload["rows"]:
            known = entries.get((row["name"], row["protocol"]))
            if known is not None and (known.result is not None or row["name"] not in payload["results"]):
                continue
            configs.setdefault(row["protocol"], payload["config"])
            label = fairseq_runs.label(row["system"]).removeprefix("+ ")
            entries[row["name"], row["protocol"]] = Entry(
                name=row["name"], source=source, system=row["system"],
                method=method_of(row["name"], row["protocol"], row["seed"]),
                label=label + (f" (`{' '.join(row['flags'])}`)" if row["flags"] else ""),
                protocol=row["protocol"], seed=row["seed"], reference=row["reference"], ablation=bool(row["flags"]),
                result=payload["results"].get(row["name"]), reference_result=payload["results"].get(row["reference"]),
                failed=row["name"] in payload.get("failures", {}))
    return list(entries.values()), configs


def header(column: Column, configs: Dict[str, Dict[str, object]]) -> str:
    """A column's title, its updates read from its table's config."""
    config = configs[column.protocol]
    if column.protocol == "scratch":
        return f"one epoch: from scratch, {config['max_update']:,} updates"
    if column.protocol == "warm":
        return f"one epoch: +{config['warm_updates']:,} from the {config['max_update']:,}-update Transformer"
    if column.protocol == "continued":
        return ("the same, last 5 averaged" if column.average
                else f"converged: +{config['warm_updates']:,} from the converged Transformer")
    return f"converged: from scratch (patience {config['patience_updates']:,}, cap {config['update_cap']:,})"


def delta_cell(entry: Entry, average: bool) -> str:
    """``+2.96†``: the entry's ΔBLEU against its reference with its significance mark; pending, failed."""
    if entry.failed:
        return "failed"
    if entry.result is None:
        return "pending"
    result = entry.result["average"] if average else entry.result
    if result.get("delta_bleu") is None:
        return "–"
    return f"{result['delta_bleu']:+.2f}".replace("-", "−") + significance_mark(result["bootstrap_p"])


def reference_of(entries: List[Entry], protocol: str) -> Optional[Entry]:
    """The Transformer the methods of a protocol are measured against (the row most of them name)."""
    named = Counter(e.reference for e in entries if e.protocol == protocol and e.method != fairseq_runs.BASELINE)
    if not named:
        return None
    return next((e for e in entries if e.name == named.most_common(1)[0][0]), None)


def bleu_cell(entry: Optional[Entry], average: bool) -> str:
    """The BLEU of a row, from its best checkpoint or its last five averaged."""
    if entry is None:
        return "–"
    if entry.result is None:
        return "pending"
    return f"{(entry.result['average'] if average else entry.result)['bleu']:.2f}"


def other_references(entries: List[Entry], references: Dict[str, Optional[Entry]],
                     titles: Dict[str, str]) -> List[str]:
    """Notes for the rows measured against another run of their protocol's Transformer than the one the first
    row shows (a table that trained its own, or the Transformer of a second seed)."""
    notes: Dict[Tuple[str, str, str, float], List[str]] = {}
    for entry in entries:
        shown = references.get(entry.protocol)
        if entry.method == fairseq_runs.BASELINE or shown is None or shown.result is None \
                or entry.reference_result is None \
                or (entry.reference, entry.reference_result["bleu"]) == (shown.name, shown.result["bleu"]):
            continue
        labels = notes.setdefault((entry.protocol, entry.reference, entry.source, entry.reference_result["bleu"]), [])
        label = entry.label + (f" (seed {entry.seed})" if entry.seed != 1 else "")
        if label not in labels:
            labels.append(label)
    return [f"{', '.join(labels)} in \"{titles[protocol]}\": against `{reference}` of `{source}` (BLEU {bleu:.2f})."
            for (protocol, reference, source, bleu), labels in notes.items()]


def by_method_table(results_dir: Path = RESULTS) -> str:
    """| method | one ΔBLEU cell per protocol |: the Transformer's BLEU first, its second seed (the noise) last;
    seeds of one method joined by " / "; methods the converged comparison does not run still listed."""
    entries, configs = read_entries(results_dir)
    columns = [c for c in COLUMNS if c.protocol in configs]
    references = {c.protocol: reference_of(entries, c.protocol) for c in columns}
    systems = list(dict.fromkeys(e.system for e in entries))
    methods: Dict[str, str] = {}
    for entry in sorted(entries, key=lambda e: systems.index(e.system)):  # a system's variants together
        if entry.method != fairseq_runs.BASELINE and (not entry.ablation or entry.protocol in CONVERGED_PROTOCOLS):
            methods.setdefault(entry.method, entry.label)
    lines = ["| method | " + " | ".join(header(c, configs) for c in columns) + " |",
             "|---|" + "---:|" * len(columns),
             "| Transformer: BLEU | " + " | ".join(bleu_cell(references[c.protocol], c.average) for c in columns)
             + " |"]

    def cells(method: str, first_seed: int) -> str:
        out = []
        for column in columns:
            found = sorted((e for e in entries if e.method == method and e.protocol == column.protocol
                            and e.seed >= first_seed), key=lambda e: e.seed)
            out.append(" / ".join(delta_cell(e, column.average) for e in found) or "–")
        return " | ".join(out)

    for method, label in methods.items():
        lines.append(f"| {label} | {cells(method, first_seed=1)} |")
    lines.append(f"| Transformer, second seed | {cells(fairseq_runs.BASELINE, first_seed=2)} |")
    notes = other_references(entries, references, {c.protocol: header(c, configs) for c in columns if not c.average})
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def cli_main(argv: Optional[List[str]] = None) -> None:
    block_cli("by-method", __doc__.splitlines()[0], by_method_table, RESULTS, argv)


if __name__ == "__main__":
    cli_main()
