"""``analysis length``: BLEU by source-sentence length (the paper's length analysis)."""

import json
import math
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from sacrebleu.metrics import BLEU

from ..analysis.scoring import align_hypotheses, read_generate_output, read_lines
from .plotting import plot_series


def read_system_output(path: Path, num_sentences: int) -> List[str]:
    """``fairseq-generate`` output (matched by id) or plain text with one line per sentence."""
    hypotheses = read_generate_output(path)
    if hypotheses:
        return align_hypotheses(hypotheses, num_sentences)[0]
    lines = read_lines(path)
    if len(lines) != num_sentences:
        raise ValueError(f"{path} has {len(lines)} lines but there are {num_sentences} references")
    return lines


def bucket_label(low: float, high: float) -> str:
    """``10-19`` for the bucket [10, 20) of source lengths, ``60+`` for the last, open one."""
    return f"{int(low)}+" if math.isinf(high) else f"{int(low)}-{int(high) - 1}"


def length_buckets(sources: Sequence[str], edges: Sequence[float]) -> List[Tuple[str, List[int]]]:
    """Sentence ids per bucket [edges[i], edges[i+1]) of source length in words."""
    buckets = []
    for low, high in zip(edges[:-1], edges[1:]):
        ids = [i for i, s in enumerate(sources) if low <= len(s.split()) < high]
        buckets.append((bucket_label(low, high), ids))
    return buckets


def bleu_by_length(sources: Sequence[str], references: Sequence[str], systems: Dict[str, Sequence[str]],
                   edges: Sequence[float]) -> Dict[str, object]:
    """Corpus BLEU of each system within each source-length bucket."""
    rows = []
    for label, ids in length_buckets(sources, edges):
        row = {"bucket": label, "sentences": len(ids)}
        for name, hyps in systems.items():
            row[name] = round(BLEU().corpus_score([hyps[i] for i in ids], [[references[i] for i in ids]]).score, 2) \
                if ids else None
        rows.append(row)
    return {"edges": [e if not math.isinf(e) else "inf" for e in edges], "rows": rows}


def format_markdown(result: Dict[str, object], systems: Sequence[str]) -> str:
    """BLEU of each system in each source-length bucket, in Markdown ("–": no sentence to score)."""
    lines = ["| source length (words) | sentences | " + " | ".join(systems) + " |",
             "|---|---:|" + "---:|" * len(systems)]
    for row in result["rows"]:
        cells = ["–" if row[s] is None else f"{row[s]:.2f}" for s in systems]
        lines.append(f"| {row['bucket']} | {row['sentences']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args) -> Dict[str, object]:
    sources, references = read_lines(Path(args.source)), read_lines(Path(args.reference))
    if len(sources) != len(references):
        raise ValueError(f"--source has {len(sources)} lines but --reference has {len(references)}")
    systems = {}
    for spec in args.system:
        name, sep, path = spec.partition("=")
        if not sep:
            raise ValueError(f"--system expects NAME=PATH, got {spec!r}")
        systems[name] = read_system_output(Path(path), len(references))
    edges = [float(e) for e in args.edges] + [math.inf]
    result = bleu_by_length(sources, references, systems, edges)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bleu_by_length.json").write_text(json.dumps(result, indent=2))
    (out / "bleu_by_length.md").write_text(format_markdown(result, list(systems)))
    labels = [f"{r['bucket']}\n({r['sentences']})" for r in result["rows"]]
    plot_series(labels, {s: [r[s] if r[s] is not None else float("nan") for r in result["rows"]] for s in systems},
                out / "bleu_by_length.png", "BLEU by source length", "source length in words (sentences)")
    return result
