"""What the experiments read from ``fairseq-train``'s logs: the per-epoch summaries (speed and gradient
statistics over a run), the ``--log-interval`` stretches, and the validations (the curve, the last one)."""

import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional

_SUMMARY = re.compile(r"\| train \| epoch \d+ \|(.*)$")
_SUMMARY_VALUE = re.compile(r"(\w+) ([0-9.,]+)")
_STRETCH = re.compile(r"\| INFO \| train_inner \| (.*)$", re.M)
_STRETCH_VALUE = re.compile(r"(\w+)=([-0-9.e]+)")
_VALID = re.compile(r"\| valid on 'valid' subset \| loss ([0-9.]+) \| nll_loss ([0-9.]+) .*\| num_updates (\d+)")


def _text(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")


def train_summary(log: Path, start_update: int = 0) -> Dict[str, float]:
    """Training speed and gradient statistics over a whole ``fairseq-train`` log that began at
    ``start_update``.

    fairseq prints one ``| train | epoch N |`` line per epoch whose ``train_wall``,
    ``wps``, ``gnorm`` and ``clip`` cover that epoch only, so they are summed and weighted here.

    Returns:
        num_updates (at the end), train_wall (seconds, all epochs), ups, wps, gnorm (mean gradient
        norm before clipping) and clip (per cent of updates clipped).
    """
    epochs = []
    for line in _text(log).splitlines():
        match = _SUMMARY.search(line)
        if match:
            epochs.append({k: float(v.replace(",", "")) for k, v in _SUMMARY_VALUE.findall(match.group(1))})
    if not epochs:
        raise RuntimeError(f"no training summary found in {log}")
    seconds = sum(e["train_wall"] for e in epochs)
    tokens = sum(e["wps"] * e["train_wall"] for e in epochs)
    updates = epochs[-1]["num_updates"] - start_update
    done = [start_update] + [e["num_updates"] for e in epochs]
    per_epoch = [after - before for before, after in zip(done, done[1:])]

    def mean_over_updates(key: str) -> float:
        return sum(e.get(key, 0.0) * n for e, n in zip(epochs, per_epoch)) / updates if updates else 0.0

    return {"num_updates": epochs[-1]["num_updates"], "train_wall": seconds,
            "ups": updates / seconds if seconds else 0.0, "wps": tokens / seconds if seconds else 0.0,
            "gnorm": mean_over_updates("gnorm"), "clip": mean_over_updates("clip")}


def train_stretches(logs: Iterable[Path]) -> List[Dict[str, float]]:
    """fairseq's statistics of every ``--log-interval`` stretch in the logs (``train_inner`` lines):
    ``ups`` (updates per second), ``gnorm`` (gradient norm before clipping), ``clip`` (per cent
    clipped) and the rest it prints."""
    return [{k: float(v) for k, v in _STRETCH_VALUE.findall(line)} for log in logs
            for line in _STRETCH.findall(_text(log))]


def validation_curve(logs: Iterable[Path]) -> List[Dict[str, float]]:
    """Every validation of a run's ``fairseq-train`` logs (segments in the order they ran): update,
    loss and nll_loss in bits, one per update (a later segment's line wins, as after a resume)."""
    by_update: Dict[int, Dict[str, float]] = {}
    for log in logs:
        for loss, nll, update in _VALID.findall(_text(log)):
            by_update[int(update)] = {"update": int(update), "loss": float(loss), "nll_loss": float(nll)}
    return [by_update[u] for u in sorted(by_update)]


def final_valid_loss(log: Path) -> Optional[Dict[str, float]]:
    """The last validation of a ``fairseq-train`` log: ``loss`` and ``nll_loss`` in bits per target
    token (fairseq's base 2); None when the log is missing or holds no validation."""
    curve = validation_curve([log]) if log.is_file() else []
    return {"loss": curve[-1]["loss"], "nll_loss": curve[-1]["nll_loss"]} if curve else None
