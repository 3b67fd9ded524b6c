"""The compute-equivalence table (``capsagg-table1 --table compute-equivalence``): systems trained from scratch to a
fixed budget of updates (``--update-cap``), each placed after every validation on the validation curves of
published converged Transformers (``--reference-curve``, :mod:`..equivalence`): how many of the Transformer's
updates each of its updates is worth, beside the Transformer's own run-to-run band. The rows train and score as
the converged table's (:class:`.converged.ConvergedTable`); rows the published table holds and this work
directory has not trained (trained on other machines) are kept."""

import argparse
from dataclasses import asdict
from typing import Dict, List

from .. import equivalence, provenance
from ..experiment import Stages
from ..reports import equivalence_report, publish
from ..rows import Prepared, Row
from . import converged


def run(args: argparse.Namespace, stages: Stages, prepared: Prepared, rows: List[Row], stem: str,
        config: Dict[str, object]) -> int:
    """Trains every row from scratch to ``--update-cap`` (:mod:`.converged`'s training and scoring), placing each
    on the reference curves after each, and writes the table ``stem`` of the work directory's ``config``; 1 if a
    row failed."""
    head = (f"{prepared.caption_head}; from scratch, {args.update_cap} updates of <= {args.max_tokens} tokens; lr "
            f"{args.lr}, warm-up {args.warmup}, inverse square root; validation every "
            f"{args.validate_interval_updates} updates")
    comparison = converged.ConvergedTable(args, stages, prepared.decoding)
    points = equivalence.checkpoints(args.update_cap, args.validate_interval_updates)

    def report_equivalence(results: Dict[str, Dict[str, object]]) -> None:
        kept = {name: res for name, res in args.published_results.items() if name not in results}
        results = {**kept, **results}
        devices: Dict[str, List[str]] = {}  # rows kept from another machine name theirs
        for name, res in results.items():
            devices.setdefault(str(res.get("device", provenance.device_name(args.gpu))), []).append(name)
        where = "; ".join(device if len(devices) == 1 else f"{device} for {', '.join(names)}"
                          for device, names in devices.items()) or provenance.device_name(args.gpu)
        caption = f"{head}; {prepared.caption_tail.replace(provenance.device_name(args.gpu), where, 1)}"
        table = equivalence_report.compute(rows, results, args.reference_curves, points, args.speed_ratios)
        payload = {"caption": caption, "config": config, "rows": [asdict(r) for r in rows],
                   "results": results, "failures": comparison.failures, "compute_equivalence": table,
                   "speed_json": [str(path) for path in args.speed_json]}
        figure = args.workdir / f"{stem}.png"
        equivalence_report.plot(table, figure)
        publish.write_outputs(args, stem, equivalence_report.format_tables(rows, results, table, caption), payload,
                              [figure], device_suffix=False)

    comparison.run(rows, report_equivalence)
    return 1 if comparison.failures else 0
