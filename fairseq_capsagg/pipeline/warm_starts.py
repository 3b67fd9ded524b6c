"""Where a warm start begins: the validation loss at step 0 of every aggregator started from a trained
Transformer (the main job's and Table 1's step-0 tables)."""

from pathlib import Path
from typing import Dict, Optional, Sequence

from . import fairseq_runs


#: How the rows of the step-0 table that need flags to start as the Transformer (the routing
#: families) start besides their default: with those flags, and with them and a ramp.
IDENTITY_STARTS = {"identity": [], "identity + ramp": ["--aggregation-ramp-updates", "1"]}


def step0_losses(checkpoint: str, data_bin: Path, shape: str,
                 aggregators: Optional[Sequence[str]] = None) -> Dict[str, Dict[str, float]]:
    """Validation loss at step 0 of a warm start from ``checkpoint``: every aggregator (or those of
    ``aggregators``) as built by default, and those with warm-start flags (the routing families) with each
    of :data:`IDENTITY_STARTS`."""
    from ..tools.warm_start_loss import warm_start_losses

    aggregators = fairseq_runs.systems()[1:] if aggregators is None else list(aggregators)
    starts = {f"transformer_{s}_{shape}": (f"transformer_{s}_{shape}", []) for s in aggregators}
    for start, extra in IDENTITY_STARTS.items():
        for system in (s for s in aggregators if fairseq_runs.warm_start_flags(s)):
            arch = f"transformer_{system}_{shape}"
            starts[f"{arch} ({start})"] = (arch, fairseq_runs.warm_start_flags(system) + extra)
    return warm_start_losses(checkpoint, str(data_bin), starts)
