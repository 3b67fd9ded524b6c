"""The compute-equivalence table (:mod:`.equivalence`) in Markdown and JSON, and its plot: per row and
checkpoint, its validation loss, the updates each Transformer run needs for it, the ratio in updates and in
seconds against the Transformer's own run-to-run band, and the row's test scores at its last update."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import equivalence, fairseq_runs
from ..rows import Row

Results = Dict[str, Dict[str, object]]


class ReferenceError(ValueError):
    """A ``--reference-curve`` file that holds no converged Transformer's validation curve."""


def read_reference_curves(paths: Sequence[Path]) -> Dict[str, equivalence.Curve]:
    """The validation curve of :data:`~.equivalence.REFERENCE` in each published converged table, by its path.

    Raises:
        ReferenceError: naming ``--reference-curve`` and the file that lacks it.
    """
    curves = {}
    for path in paths:
        try:
            row = json.loads(Path(path).read_text())["results"][equivalence.REFERENCE]
            curves[str(path)] = row["curve"]
        except (OSError, ValueError, KeyError) as e:
            raise ReferenceError(f"--reference-curve: {path} is not a converged table with the validation curve "
                                 f"of {equivalence.REFERENCE} ({type(e).__name__}: {e}); give a converged-*.json "
                                 "written by capsagg-table1 --table converged") from None
    return curves


def compute(rows: List[Row], results: Results, references: Dict[str, equivalence.Curve], points: Sequence[int],
            speed_ratios: Dict[str, Dict[str, object]]) -> Dict[str, object]:
    """Every trained row's :func:`~.equivalence.row_equivalence` with its verdict per point, and the noise band;
    its seconds from the training-speed ratio measured on the device the row trained on (``speed_ratios``: by
    device, as :func:`~..drivers.table1_rows.speed_ratios_by_device` reads them; none there: no seconds). Then the
    Transformer's seed band (the runs' noise band and its rows here, :func:`~.equivalence.seed_band`) and each other
    system over its seeds (:func:`~.equivalence.seed_summary`)."""
    band = equivalence.noise_band(references, points)
    out = {"points": list(points), "references": list(references), "noise_band": {str(u): list(b) for u, b in band.items()},
           "speed_ratios": speed_ratios, "rows": {}}
    for row in (r for r in rows if r.name in results):
        measured_on = speed_ratios.get(str(results[row.name].get("device")), {"ratios": {}})
        measured = equivalence.row_equivalence(results[row.name]["curve"], references, points,
                                               measured_on["ratios"].get(row.system))
        for point in measured:
            point["faster"] = equivalence.faster(point, band)
        out["rows"][row.name] = measured
    transformer = [r.name for r in rows if r.system == fairseq_runs.BASELINE]
    seeds = equivalence.seed_band(out["rows"], transformer, points, band)
    out["seed_band"] = {str(u): list(b) for u, b in seeds.items()}
    systems: Dict[str, Dict[str, int]] = {}
    for row in rows:
        if row.system != fairseq_runs.BASELINE and row.name in out["rows"]:
            systems.setdefault(row.system, {})[row.name] = row.seed
    out["systems"] = {system: equivalence.seed_summary(out["rows"], by_name, points, seeds)
                      for system, by_name in systems.items()}
    return out


def span(pair: Optional[Sequence[float]]) -> str:
    """``1.23`` or ``1.32-1.34``: a ratio's lowest and highest over the Transformer runs; "–" without one."""
    if pair is None:
        return "–"
    low, high = f"{pair[0]:.2f}", f"{pair[1]:.2f}"
    return low if low == high else f"{low}-{high}"


def _verdict(value: Optional[bool]) -> str:
    return {None: "–", True: "yes", False: "no"}[value]


def format_tables(rows: List[Row], results: Results, table: Dict[str, object], caption: str) -> str:
    """The caption, then :func:`format_body`."""
    return f"{caption}\n\n" + format_body(rows, results, table)


def format_body(rows: List[Row], results: Results, table: Dict[str, object]) -> str:
    """The table per row and checkpoint, then the rows' test scores at their last update."""
    band = {int(u): b for u, b in table["noise_band"].items()}
    runs = " / ".join(f"`{name}`" for name in table["references"])
    speeds = "; ".join(f"`{measured['source']}` on {device}" for device, measured in table["speed_ratios"].items())
    out = [f"Transformer runs placed on: {runs}. Ratio: the runs' updates to reach the row's validation loss over the "
           "row's updates (lowest-highest over the runs); in seconds, times the row's training speed over the "
           "Transformer's on the machine the row trained on (" + (speeds or "none measured") + "; – where none "
           "was). Noise: the Transformer's runs placed on each other's curves. Faster: the ratio against every run "
           "above the noise.", "",
           "| row | model | updates | valid loss | Transformer's updates | ratio (updates) | ratio (seconds) "
           "| noise | faster |",
           "|---|---|---:|---:|---|---:|---:|---:|---|"]
    for row in rows:
        if row.name not in table["rows"]:
            out.append(f"| {row.name} | {fairseq_runs.label(row.system)} | not measured |  |  |  |  |  |  |")
            continue
        for point in table["rows"][row.name]:
            loss = "–" if point["loss"] is None else f"{point['loss']:.3f}"
            reached = " / ".join("never" if u is None else f"{u:,.0f}" for u in point["reference_updates"].values())
            noise = span(band.get(point["update"]))
            out.append(f"| {row.name} | {fairseq_runs.label(row.system)} | {point['update']:,} | {loss} | {reached} "
                       f"| {span(point['updates_ratio'])} | {span(point['seconds_ratio'])} | {noise} "
                       f"| {_verdict(point['faster'])} |")
    out += seeds_section(rows, results, table)
    out += ["", "Test split at the last update (best checkpoint, beam search):", "",
            "| row | updates | best valid loss | BLEU | chrF | length ratio | last 5 averaged: BLEU |",
            "|---|---:|---:|---:|---:|---:|---:|"]
    for row in (r for r in rows if r.name in results):
        res = results[row.name]
        out.append(f"| {row.name} | {res['stopped_at']:,} | {res['best_loss']:.3f} | {res['bleu']:.2f} "
                   f"| {res['chrf']:.2f} | {res['length_ratio']:.3f} | {res['average']['bleu']:.2f} |")
    return "\n".join(out) + "\n"


def spread(values: Sequence[float], digits: int = 2) -> str:
    """``20.41 (20.12-20.70)``: the mean of ``values`` and their range; one value alone; "–" without any."""
    if not values:
        return "–"
    mean = f"{sum(values) / len(values):.{digits}f}"
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return mean if low == high else f"{mean} ({low}-{high})"


def seeds_section(rows: List[Row], results: Results, table: Dict[str, object]) -> List[str]:
    """Each system over its seeds against the Transformer's seed band at every point, with the verdict at the last
    and the test BLEU of the seeds at the last update beside the Transformer seeds' (none in a table without the
    seed summary)."""
    if "systems" not in table:
        return []
    points = table["points"]
    band = {int(u): b for u, b in table["seed_band"].items()}
    transformer = [r for r in rows if r.system == fairseq_runs.BASELINE and r.name in results]

    def bleu(names: List[str], key: Optional[str] = None) -> str:
        return spread([(results[n][key] if key else results[n])["bleu"] for n in names if n in results])

    names = ", ".join(f"`{r.name}`" for r in transformer) or "none trained yet"
    head = " | ".join(f"{u:,}" for u in points)
    out = ["", f"Over seeds: each system's ratio (mean of its seeds, in brackets the span over every seed and run) "
           "against the Transformer's seed band: the runs' own seed (each run on the other's curve, the noise above) "
           f"and its rows here, seeds other than the runs' ({names}). Saves updates: every seed against every "
           "run above every Transformer seed (below: under it; within: neither). Test BLEU at the last update over "
           "the seeds (best checkpoint; last 5 averaged; the Transformer's: its rows here).", "",
           f"| model | seeds | {head} | at {points[-1]:,} | BLEU | BLEU, averaged |",
           "|---|---|" + "---:|" * len(points) + "---|---:|---:|"]
    seeds = ", ".join(["the runs"] + [str(r.seed) for r in transformer]) if transformer else ""
    cells = " | ".join(span(band.get(u)) for u in points)
    out.append(f"| {fairseq_runs.label(fairseq_runs.BASELINE)} (seed band) | {seeds or '–'} | {cells} | – "
               f"| {bleu([r.name for r in transformer])} | {bleu([r.name for r in transformer], 'average')} |")
    for system, measured in table["systems"].items():
        own = [r for r in rows if r.system == system and r.name in results]
        cells = " | ".join("–" if p["mean"] is None else f"{p['mean']:.2f} ({span(p['span'])})" for p in measured)
        last = measured[-1]
        verdict = ("–" if last["above"] is None else "saves updates" if last["above"]
                   else "costs updates" if last["below"] else "within")
        out.append(f"| {fairseq_runs.label(system)} | {', '.join(str(r.seed) for r in own)} | {cells} | {verdict} "
                   f"| {bleu([r.name for r in own])} | {bleu([r.name for r in own], 'average')} |")
    return out


def plot(table: Dict[str, object], path: Path) -> None:
    """Compute-equivalence in updates against updates, one line per row (the middle of its runs' span), and the
    Transformer's own band shaded."""
    from ...analysis.plotting import plot_ratio_curves

    lines: Dict[str, Tuple[List[int], List[float]]] = {}
    for name, points in table["rows"].items():
        measured = [p for p in points if p["updates_ratio"] is not None]
        lines[name] = ([p["update"] for p in measured], [sum(p["updates_ratio"]) / 2 for p in measured])
    band = {int(u): b for u, b in table["noise_band"].items()}
    plot_ratio_curves(lines, band, path)
