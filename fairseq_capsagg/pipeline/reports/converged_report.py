"""The converged comparison's report: compute equivalence, its Markdown tables and its validation curves.

:mod:`.converged` trains and scores the rows; this turns their results into what ``capsagg-table1 --table
converged`` publishes (``converged-cpu.md``, ``converged-curves.png``). Every table is a function of the
results alone, so a published JSON rebuilds its Markdown exactly.
"""

import argparse
from pathlib import Path
from typing import Dict, List, Optional

from .. import convergence, fairseq_runs
from ..rows import CONTINUED_REFERENCE, SCORE_HEADER, Row, score_cells, tuned_table
from ..rows import CONVERGED_REFERENCE as REFERENCE
from . import report

Results = Dict[str, Dict[str, object]]

#: The columns every row of both protocols fills.
ROW_HEADER = ("| row | model | seed | updates | best at | best valid loss | params | idle updates/s | load "
              f"{SCORE_HEADER}\n"
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")


def compute_equivalence(rows: List[Row], results: Results) -> Optional[Dict[str, object]]:
    """When each row from scratch first reaches the converged Transformer's best validation loss, in
    updates and in seconds at its idle speed, and the Transformer's updates and seconds over the row's
    (above 1: the row gets there with less compute)."""
    if REFERENCE not in results:
        return None
    reference = results[REFERENCE]
    target = min(point["loss"] for point in reference["curve"])
    base_updates = convergence.first_reaching(reference["curve"], target)
    base_seconds = base_updates / reference["idle_updates_per_s"]
    equivalence = {"target_loss": target, "reference": REFERENCE, "rows": {}}
    for row in (r for r in rows if r.protocol == "converged" and r.name in results):
        res = results[row.name]
        updates = convergence.first_reaching(res["curve"], target)
        seconds = None if updates is None else updates / res["idle_updates_per_s"]
        equivalence["rows"][row.name] = {
            "updates": updates, "seconds": None if seconds is None else round(seconds),
            "updates_ratio": None if updates is None else round(base_updates / updates, 2),
            "seconds_ratio": None if seconds is None else round(base_seconds / seconds, 2)}
    return equivalence


def stop_note(result: Dict[str, object], protocol: str) -> str:
    """How a row from scratch ended, after its update count: `` (snapshot)`` (a published row frozen while it
    still trained), `` (cap)`` (stopped by ``--update-cap``), or nothing (converged; continued rows train a
    fixed number of updates)."""
    if result.get("snapshot"):
        return " (snapshot)"
    return "" if result["converged"] or protocol == "continued" else " (cap)"


def model_label(row: Row) -> str:
    """The model column: the system's label and the row's own flags."""
    return fairseq_runs.label(row.system) + (f" ({' '.join(row.flags)})" if row.flags else "")


def protocol_titles(rows: List[Row], results: Results, args: argparse.Namespace) -> Dict[str, str]:
    """The heading of each protocol's table: what its rows are read against."""
    lr = f"{results[CONTINUED_REFERENCE]['lr']:.3g}" if CONTINUED_REFERENCE in results else "pending"
    same_seed = {}
    for protocol in ("converged", "continued"):
        names = ", ".join(f"`{r.name}` against `{r.reference}`" for r in rows if r.protocol == protocol
                          and r.reference not in (r.name, REFERENCE, CONTINUED_REFERENCE))
        same_seed[protocol] = f"; {names}, the Transformer of the same seed" if names else ""
    return {"converged": f"From scratch until converged (against `{REFERENCE}`{same_seed['converged']})",
            "continued": f"Continued from `{REFERENCE}`'s best checkpoint, {args.warm_updates} further updates at "
                         f"its learning rate ({lr}) after a {args.warmup}-update warm-up (`{CONTINUED_REFERENCE}` "
                         f"against `{REFERENCE}`, the aggregators and second seeds against `{CONTINUED_REFERENCE}`"
                         f"{same_seed['continued']})"}


def protocol_tables(rows: List[Row], results: Results, args: argparse.Namespace,
                    failures: Dict[str, str]) -> List[str]:
    """One table per protocol, every row of it: trained and scored, pending, or failed with why."""
    titles = protocol_titles(rows, results, args)
    out = []
    for protocol in ("converged", "continued"):
        out += [f"### {titles[protocol]}", "", ROW_HEADER]
        for row in (r for r in rows if r.protocol == protocol):
            res = results.get(row.name)
            if res is None:
                state = f"failed: {failures[row.name]}" if row.name in failures else "pending"
                out.append(f"| {row.name} | {model_label(row)} | {row.seed} | {state} |" + "  |" * 11)
                continue
            params = (f"{res['params'] / 1e6:.2f}M" if "delta_params" not in res
                      else f"{res['delta_params'] / 1e6:+.2f}M")
            stop = f"{res['stopped_at']}" + stop_note(res, protocol)
            load = "–" if res.get("load_average") is None else f"{res['load_average']:.1f}"
            out.append(f"| {row.name} | {model_label(row)} | {row.seed} | {stop} | {res['best_update']} "
                       f"| {res['best_loss']:.3f} | {params} | {res['idle_updates_per_s']:.2f} | {load} "
                       f"| {score_cells(res)} |")
        out.append("")
    return out


def average_table(done: List[Row], results: Results) -> List[str]:
    """The rows scored with the average of their last interval checkpoints."""
    out = [f"### Average of the last {convergence.AVERAGED} interval checkpoints (against the same rows, averaged)",
           "", f"| row | updates averaged {SCORE_HEADER}", "|---|---|---:|---:|---:|---:|---:|---|"]
    for row in done:
        res = results[row.name]["average"]
        out.append(f"| {row.name} | {', '.join(map(str, res['updates']))} | {score_cells(res)} |")
    return out + [""]


def equivalence_table(equivalence: Optional[Dict[str, object]]) -> List[str]:
    """:func:`compute_equivalence` as a table (nothing before the Transformer is trained)."""
    if not equivalence:
        return []
    out = [f"### Compute equivalence: the first validation at or below `{REFERENCE}`'s best validation loss "
           f"({equivalence['target_loss']:.3f} bits)", "",
           "| row | updates | seconds at idle speed | Transformer's updates / row's "
           "| Transformer's seconds / row's |",
           "|---|---:|---:|---:|---:|"]
    for name, eq in equivalence["rows"].items():
        cells = ("never | – | – | –" if eq["updates"] is None else
                 f"{eq['updates']} | {eq['seconds']} | {eq['updates_ratio']:.2f} | {eq['seconds_ratio']:.2f}")
        out.append(f"| {name} | {cells} |")
    return out + [""]


def search_error_table(done: List[Row], results: Results) -> List[str]:
    """The model's scores of its hypotheses and of the references (``--score-reference``)."""
    out = ["### Model error or search error (test split, best checkpoint, `fairseq-generate --score-reference`)", "",
           "| row | sentences | mean score of the beam's hypotheses | mean score of the references "
           "| references the model prefers (search errors) |",
           "|---|---:|---:|---:|---:|"]
    for row in done:
        ref = results[row.name]["references"]
        if ref.get("sentences"):
            out.append(f"| {row.name} | {ref['sentences']} | {ref['mean_hypothesis_score']:.3f} "
                       f"| {ref['mean_reference_score']:.3f} | {100 * ref['search_error_share']:.1f}% |")
    return out + [""]


def legend(args: argparse.Namespace) -> str:
    """What every column means and how the rows were trained, validated and scored."""
    return (
        f"Validation every {args.validate_interval_updates} updates on the validation split as fairseq validates "
        f"it (it leaves out the last, longest batch when that holds fewer than {fairseq_runs.FAIRSEQ_BATCH_MULTIPLE} "
        "sentences, `--required-batch-size-multiple`; fairseq issue #5036); a row from scratch stops when its best "
        f"validation loss has not improved for {args.patience_updates} updates (fairseq's `--patience`, applied to "
        "the checkpoints on disk so that resumed runs stop where uninterrupted ones would), at most "
        f"{args.update_cap} updates (\"(cap)\": stopped there). Best valid loss: label-smoothed cross-entropy, bits "
        "per target token, of the best checkpoint, which every BLEU above the averages decodes, every test sentence "
        "(`fairseq-generate --required-batch-size-multiple 1`). BLEU and chrF: sacrebleu on detokenised output. "
        "† p < 0.01, * p < 0.05 (paired bootstrap, 1000 resamples). Sign test: two-sided binomial over sentences "
        "whose sentence-BLEU differs. Idle updates/s: the upper decile of fairseq's `ups` over the row's "
        "`--log-interval` stretches; stretches that shared the cores are slower, so this is the speed on idle "
        "cores; seconds at idle speed are updates divided by it. Load: the mean 1-minute load average of the "
        "machine while the row trained (on this project's 2-core CPUs, 2 is one training alone). Scores of "
        "hypotheses and references: log-probability per token, base 2, as fairseq prints them; a search error is "
        "a sentence whose reference the model scores above the hypothesis beam search returned.")


def format_tables(rows: List[Row], results: Results, equivalence, caption: str,
                  args: argparse.Namespace, failures: Optional[Dict[str, str]] = None,
                  step0: Optional[Dict[str, Dict[str, float]]] = None) -> str:
    """The converged comparison in Markdown: both protocols, the checkpoint averages, compute
    equivalence, model against search errors and where the continued rows start (``step0``); rows not
    trained are pending, or failed with why (``failures``)."""
    done = [row for row in rows if row.name in results]
    out = ([caption, ""] + protocol_tables(rows, results, args, failures or {}) + average_table(done, results)
           + equivalence_table(equivalence) + search_error_table(done, results)
           + tuned_table(done, results, args.lenpen_grid, decoded=", from its best checkpoint")
           + [legend(args)])
    frozen = [f"`{name}` at update {res['stopped_at']}" for name, res in results.items() if res.get("snapshot")]
    if frozen:
        out += ["", f"\"(snapshot)\": frozen while its rule had not stopped it ({', '.join(frozen)}): not "
                    "converged, its best checkpoint of then."]
    out += report.format_row_notes(results)
    if step0:
        out += ["", report.format_step0(step0, f"`{REFERENCE}`'s best checkpoint (where the continued rows start; "
                                               "`baseline` is the Transformer itself)").rstrip("\n")]
    return "\n".join(out) + "\n"


def plot_curves(rows: List[Row], results: Results, equivalence, path: Path) -> None:
    """Validation loss of the rows from scratch against updates and against seconds at idle speed, and of
    the continued rows against their further updates."""
    from ...analysis.plotting import plot_validation_curves

    curves = {"updates": {}, "seconds": {}, "continued": {}}
    for row in (r for r in rows if r.name in results):
        res = results[row.name]
        updates = [p["update"] for p in res["curve"]]
        losses = [p["loss"] for p in res["curve"]]
        if row.protocol == "converged":
            curves["updates"][row.name] = (updates, losses)
            curves["seconds"][row.name] = ([u / res["idle_updates_per_s"] for u in updates], losses)
        else:
            curves["continued"][row.name] = (updates, losses)
    reference = results.get(REFERENCE, {})
    label = (f"Transformer, snapshot at {reference['stopped_at']}" if reference.get("snapshot") else
             "converged Transformer")
    plot_validation_curves(curves, path, None if equivalence is None else equivalence["target_loss"], label)
