"""Tables rebuilt from the JSON published beside them, as the drivers write them."""

import argparse
from pathlib import Path
from typing import Dict

from fairseq_capsagg.pipeline.reports import converged_report, report, table1_report
from fairseq_capsagg.pipeline.rows import published_rows


def table1_table(payload: Dict[str, object], table: str) -> str:
    """The Markdown that ``capsagg-table1 --table paper|peers`` writes for ``payload`` (its JSON)."""
    speed_json = [Path(payload.get("speed_ratios", {}).get("source", "benchmarks/results/speed.json"))]
    args = argparse.Namespace(table=table, max_update=payload["config"]["max_update"], speed_json=speed_json,
                              lenpen_grid=payload["lenpen_grid"])
    written = table1_report.format_tables(published_rows(payload), payload["results"], payload["caption"], args)
    if payload.get("warm_start_step0"):
        written += "\n" + report.format_step0(payload["warm_start_step0"])
    return written


def converged_table(payload: Dict[str, object]) -> str:
    """The Markdown that ``capsagg-table1 --table converged`` writes for ``payload`` (its JSON)."""
    config = payload["config"]
    args = argparse.Namespace(**{key: config[key] for key in (
        "warm_updates", "warmup", "validate_interval_updates", "patience_updates", "update_cap")},
                              lenpen_grid=payload["lenpen_grid"])
    return converged_report.format_tables(published_rows(payload), payload["results"],
                                          payload["compute_equivalence"], payload["caption"], args,
                                          payload.get("failures", {}), payload.get("continued_step0"))
