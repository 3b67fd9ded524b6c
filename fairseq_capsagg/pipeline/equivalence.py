"""Compute-equivalence from scratch (``capsagg-table1 --table compute-equivalence``): do the methods that
lead after one epoch converge faster, or only start faster?

Every row trains one system from scratch with the converged Transformer's configuration for a fixed budget
(``--update-cap``, 5,000 updates by default; no early stop; its rows: :func:`.drivers.table1_rows.equivalence_rows`),
validated on the grid of the converged runs. At the updates of :func:`checkpoints` its validation loss L is placed on the validation curves of published
converged Transformer runs (``--reference-curve``, one JSON each): the update at which each run first reaches
L, interpolated linearly between its validations (:func:`updates_to_reach`), over the row's update, is the
row's compute-equivalence in updates (above 1: the Transformer needs more updates for the same loss). Times
the row's training speed over the Transformer's on the machine the row trained on (``--speed-json``, one file per
machine) it is the equivalence in seconds.

The noise of that ratio is measured twice. The Transformer's run-to-run band (:func:`noise_band`): each
converged run placed on the other's curve, which is the same setup rerun, not another seed. The seed band
(:func:`seed_band`): that band, the runs' own seed, with the Transformer trained from scratch in this table with
other seeds than the runs', placed on their curves like every row. With seeds, a method saves updates only where
every seed of it, against every run, lies above every Transformer seed (:func:`seed_summary`).
"""

from typing import Dict, List, Optional, Sequence, Tuple

from .rows import CONVERGED_REFERENCE

#: Updates of every row by default (``--update-cap``).
UPDATE_CAP = 5000
#: The converged runs' row whose curve the rows are placed on.
REFERENCE = CONVERGED_REFERENCE

Curve = Sequence[Dict[str, float]]


def checkpoints(cap: int, interval: int) -> List[int]:
    """The updates a row is read at: five points up to ``cap`` on the validation grid (1,000 to 5,000 for
    the default cap and interval), every validation when the budget holds fewer than five."""
    step = interval * max(1, cap // (5 * interval))
    return list(range(step, cap + 1, step))


def loss_at(curve: Curve, update: int) -> Optional[float]:
    """The validation loss of ``curve`` at ``update`` (None: not validated there)."""
    return next((point["loss"] for point in curve if point["update"] == update), None)


def updates_to_reach(curve: Curve, loss: float) -> Optional[float]:
    """The update at which ``curve`` first reaches ``loss``: between the last validation above it and the first
    at or below it, linearly; the first validation's update when that one is already at or below it; None when
    the curve never gets there."""
    previous = None
    for point in curve:
        if point["loss"] <= loss:
            if previous is None or previous["loss"] == point["loss"]:
                return float(point["update"])
            share = (previous["loss"] - loss) / (previous["loss"] - point["loss"])
            return previous["update"] + share * (point["update"] - previous["update"])
        previous = point
    return None


def ratio(reference: Curve, loss: Optional[float], update: int) -> Optional[float]:
    """The reference's updates to reach ``loss`` over ``update`` (None where either is missing)."""
    if loss is None:
        return None
    reached = updates_to_reach(reference, loss)
    return None if reached is None else reached / update


def noise_band(references: Dict[str, Curve], points: Sequence[int]) -> Dict[int, Tuple[float, float]]:
    """At each of ``points``, the lowest and highest ratio of one reference run placed on another's curve: the
    compute-equivalence of the Transformer against itself (empty with fewer than two runs)."""
    band = {}
    for update in points:
        ratios = [ratio(other, loss_at(own, update), update)
                  for name, own in references.items() for other_name, other in references.items() if other_name != name]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            band[update] = (min(ratios), max(ratios))
    return band


def row_equivalence(curve: Curve, references: Dict[str, Curve], points: Sequence[int],
                    speed_ratio: Optional[float]) -> List[Dict[str, object]]:
    """At each of ``points``, the row's validation loss, each reference run's updates to reach it and the ratio,
    and the lowest and highest ratio in updates and in seconds (times ``speed_ratio``, the row's training speed
    over the Transformer's; None without one)."""
    out = []
    for update in points:
        loss = loss_at(curve, update)
        runs = {name: updates_to_reach(ref, loss) if loss is not None else None for name, ref in references.items()}
        ratios = [reached / update for reached in runs.values() if reached is not None]
        point = {"update": update, "loss": loss, "reference_updates": runs,
                 "updates_ratio": [min(ratios), max(ratios)] if ratios and len(ratios) == len(runs) else None}
        point["seconds_ratio"] = (None if point["updates_ratio"] is None or speed_ratio is None
                                  else [r * speed_ratio for r in point["updates_ratio"]])
        out.append(point)
    return out


def faster(point: Dict[str, object], band: Dict[int, Tuple[float, float]]) -> Optional[bool]:
    """Whether a row converges faster at ``point``: its ratio against every reference run above the noise band's
    top (None where either is missing)."""
    if point["updates_ratio"] is None or point["update"] not in band:
        return None
    return point["updates_ratio"][0] > band[point["update"]][1]


def slower(point: Dict[str, object], band: Dict[int, Tuple[float, float]]) -> Optional[bool]:
    """Whether a row converges slower at ``point``: its ratio against every reference run below the noise band's
    bottom (None where either is missing)."""
    if point["updates_ratio"] is None or point["update"] not in band:
        return None
    return point["updates_ratio"][1] < band[point["update"]][0]


def seed_band(measured: Dict[str, List[Dict[str, object]]], transformer_rows: Sequence[str],
              points: Sequence[int], runs: Dict[int, Tuple[float, float]]) -> Dict[int, Tuple[float, float]]:
    """At each of ``points``, the lowest and highest ratio of every Transformer seed: the runs' own seed (``runs``,
    :func:`noise_band`: each run on the other's curve) and the Transformer's seed rows (``measured``: each row's
    :func:`row_equivalence`) against every run. The Transformer's seed spread; empty without a measured seed row."""
    band = {}
    for index, update in enumerate(points):
        spans = [measured[name][index]["updates_ratio"] for name in transformer_rows if name in measured]
        spans = [span for span in spans if span is not None]
        if spans:
            spans += [runs[update]] if update in runs else []
            band[update] = (min(low for low, _ in spans), max(high for _, high in spans))
    return band


def seed_summary(measured: Dict[str, List[Dict[str, object]]], seeds: Dict[str, int], points: Sequence[int],
                 band: Dict[int, Tuple[float, float]]) -> List[Dict[str, object]]:
    """One system's ratio over its seed rows (``seeds``: row name -> seed; ``measured`` as in :func:`seed_band`) at
    each of ``points``: each seed's span over the reference runs, the mean over seeds of each span's middle, the
    span over every seed and run, and whether that whole span lies above (``above``) or below (``below``) the seed
    ``band`` (None without a band there or a seed not measured there)."""
    out = []
    for index, update in enumerate(points):
        spans = {seed: measured[name][index]["updates_ratio"] for name, seed in seeds.items() if name in measured}
        complete = bool(spans) and all(span is not None for span in spans.values())
        whole = [min(s[0] for s in spans.values()), max(s[1] for s in spans.values())] if complete else None
        mean = sum((s[0] + s[1]) / 2 for s in spans.values()) / len(spans) if complete else None
        bounds = band.get(update)
        out.append({"update": update, "seeds": {str(seed): span for seed, span in spans.items()}, "mean": mean,
                    "span": whole, "above": None if whole is None or bounds is None else whole[0] > bounds[1],
                    "below": None if whole is None or bounds is None else whole[1] < bounds[0]})
    return out
