"""Tables rebuilt from the JSON published beside them, as the drivers write them."""

import argparse
from typing import Dict

from fairseq_capsagg.pipeline import converged
from fairseq_capsagg.pipeline.rows import Row


def converged_table(payload: Dict[str, object]) -> str:
    """The Markdown that ``capsagg-table1 --table converged`` writes for ``payload`` (its JSON)."""
    rows = [Row(**{**row, "flags": tuple(row["flags"])}) for row in payload["rows"]]
    config = payload["config"]
    args = argparse.Namespace(**{key: config[key] for key in (
        "warm_updates", "warmup", "validate_interval_updates", "patience_updates", "update_cap")})
    return converged.format_tables(rows, payload["results"], payload["compute_equivalence"], payload["caption"],
                                   args, payload.get("failures", {}), payload.get("continued_step0"))
