"""Training to convergence, resumably: the stop rule, checkpoint averages, search errors.

fairseq's ``--patience N`` stops a run after N validations without a better validation loss, but
its counter lives in memory (``should_stop_early.best``): a resumed run forgets it and counts
afresh. Here the rule is applied to what the run left on disk instead: the update of
``checkpoint_best.pt`` (fairseq writes it whenever the validation loss is at least as good as the
best so far) and the update of ``checkpoint_last.pt``. ``fairseq-train`` then runs in segments,
each to ``--max-update`` = the best update plus the patience, until a segment ends without a new
best or the cap is reached, so a run stopped and resumed anywhere stops where an uninterrupted
one would.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ..patches.safe_checkpoints import allow_fairseq_checkpoint_globals
from .fairseq_runs import ToolFailed


@dataclass(frozen=True)
class StopRule:
    """Validate every ``interval`` updates; stop once ``patience`` updates passed without a better
    validation loss, or at ``cap`` updates."""

    interval: int = 500
    patience: int = 3000
    cap: int = 30000

    @classmethod
    def of(cls, config: Dict[str, object]) -> "StopRule":
        """The rule a converged run's ``config.json`` records."""
        return cls(config["validate_interval_updates"], config["patience_updates"], config["update_cap"])

    def __post_init__(self):
        if self.interval < 1 or self.patience < self.interval or self.patience % self.interval \
                or self.cap < self.interval or self.cap % self.interval:
            raise ValueError(f"--validate-interval-updates {self.interval}, --patience-updates {self.patience} and "
                             f"--update-cap {self.cap}: the patience and the cap must be positive multiples of "
                             "the validation interval")

    def target(self, best_update: int) -> int:
        """The update at which the run stops unless a validation after ``best_update`` is better."""
        return min(self.cap, best_update + self.patience)

    def converged(self, best_update: int, stopped_at: int) -> bool:
        """Whether a run that stopped at ``stopped_at`` ran out of patience (rather than hit the cap)."""
        return best_update + self.patience <= stopped_at

    def fairseq_flags(self) -> List[str]:
        """Validation and a checkpoint every ``interval`` updates and nowhere else (not at epoch
        ends), the last five interval checkpoints kept for :func:`average_checkpoints`."""
        never = "1000000"  # epochs: validation and saving happen on the update grid only
        return ["--validate-interval-updates", str(self.interval), "--save-interval-updates", str(self.interval),
                "--validate-interval", never, "--save-interval", never, "--keep-interval-updates", str(AVERAGED)]


#: How many of the last interval checkpoints are averaged (as NMT papers report).
AVERAGED = 5


def _load(path: Path) -> Dict[str, object]:
    allow_fairseq_checkpoint_globals()
    return torch.load(path, map_location="cpu", weights_only=True)


def checkpoint_updates(path: Path) -> Tuple[int, Optional[float]]:
    """The number of updates a fairseq checkpoint was saved at, and its validation loss (None when
    it was saved without a validation)."""
    state = _load(path)
    return int(state["optimizer_history"][-1]["num_updates"]), state.get("extra_state", {}).get("val_loss")


def train_in_segments(train_segment: Callable[[int, int], None], save_dir: Path,
                      target: Callable[[int], int]) -> Dict[str, object]:
    """Runs ``train_segment(start_update, max_update)`` (``fairseq-train`` resuming from
    ``save_dir/checkpoint_last.pt``) until the run has reached ``target(best_update)``, the update
    of its best checkpoint deciding where it ends (:meth:`StopRule.target`, or a fixed number of
    updates); resumable at any point.

    Returns:
        ``stopped_at`` (updates), ``best_update`` and ``best_loss`` (bits, that of the best checkpoint).

    Raises:
        ToolFailed: a segment failed, or ended without saving past where it started.
    """
    while True:
        progress = on_disk(save_dir)
        if progress["stopped_at"] >= target(progress["best_update"]):
            return progress
        before, last = progress["stopped_at"], save_dir / "checkpoint_last.pt"
        train_segment(before, target(progress["best_update"]))
        if not last.exists() or checkpoint_updates(last)[0] <= before:
            raise ToolFailed(f"fairseq-train ended without saving past update {before} in {save_dir}")


def on_disk(save_dir: Path) -> Dict[str, object]:
    """Where the run saving to ``save_dir`` stands: ``stopped_at`` (the update of its last checkpoint, 0
    before any), ``best_update`` and ``best_loss`` (bits, that of its best checkpoint; 0 and None before any)."""
    last, best = save_dir / "checkpoint_last.pt", save_dir / "checkpoint_best.pt"
    best_update, best_loss = checkpoint_updates(best) if best.exists() else (0, None)
    return {"stopped_at": checkpoint_updates(last)[0] if last.exists() else 0, "best_update": best_update,
            "best_loss": None if best_loss is None else float(best_loss)}


def idle_speed(speeds: Sequence[float]) -> Optional[float]:
    """Updates per second on idle cores, estimated as the upper decile of the stretches' speeds:
    stretches that shared the CPU with other work (tests, decoding) are slower, never faster."""
    if not speeds:
        return None
    ranked = sorted(speeds)
    return ranked[min(len(ranked) - 1, int(0.9 * len(ranked)))]


def first_reaching(curve: Sequence[Dict[str, float]], loss: float) -> Optional[int]:
    """The first update whose validation loss is at most ``loss`` (None: never)."""
    return next((point["update"] for point in curve if point["loss"] <= loss), None)


def interval_checkpoints_by_update(save_dir: Path) -> Dict[int, Path]:
    """fairseq's interval checkpoints (``checkpoint_EPOCH_UPDATES.pt``) in ``save_dir`` by their update (read
    from the name), oldest first."""
    found = [(int(m.group(1)), p) for p in save_dir.glob("checkpoint_*_*.pt")
             if (m := re.fullmatch(r"checkpoint_\d+_(\d+)\.pt", p.name))]
    return dict(sorted(found))


def interval_checkpoints(save_dir: Path) -> List[Path]:
    """fairseq's interval checkpoints in ``save_dir``, oldest first."""
    return list(interval_checkpoints_by_update(save_dir).values())


def average_checkpoints(paths: Sequence[Path], out: Path) -> Path:
    """Writes the element-wise mean of the checkpoints' model weights to ``out`` (fairseq's
    ``scripts/average_checkpoints.py``, which its wheel does not install); the rest of the newest
    checkpoint (its configuration) is kept, its optimizer state dropped."""
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [_load(p) for p in paths]
    keys = list(states[-1]["model"])
    if any(list(s["model"]) != keys for s in states):
        raise ValueError(f"checkpoints {', '.join(map(str, paths))} hold different parameters")
    averaged = dict(states[-1])
    averaged["model"], by_storage = {}, {}
    for key in keys:
        newest = states[-1]["model"][key]
        tied = (newest.untyped_storage().data_ptr(), newest.storage_offset(), tuple(newest.shape))
        if tied not in by_storage:  # a tied weight (shared embeddings) stays one tensor
            by_storage[tied] = torch.stack([s["model"][key].double() for s in states]).mean(0).to(newest.dtype)
        averaged["model"][key] = by_storage[tied]
    averaged["averaged_checkpoints"] = [p.name for p in paths]
    return save_without_optimizer(averaged, out)


def save_without_optimizer(state: Dict[str, object], out: Path) -> Path:
    """Writes a fairseq checkpoint ``state`` to ``out`` with its optimizer state dropped (a third of the
    size: what a warm start (``--finetune-from-model``) and decoding read is kept, the update count too)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**state, "last_optimizer_state": None}, out)
    return out


_SCORE = re.compile(r"^H-(\d+)\t(-?[0-9.]+(?:e-?\d+)?|-?inf|nan)\t")


def hypothesis_scores(path: Path) -> Dict[int, float]:
    """The score of every hypothesis of ``fairseq-generate`` output by sentence id (its log-probability
    per token, base 2, divided by length ** lenpen; with ``--score-reference``, the reference's)."""
    scores = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = _SCORE.match(line)
            if match:
                scores[int(match.group(1))] = float(match.group(2))
    return scores


def search_errors(hypotheses: Dict[int, float], references: Dict[int, float]) -> Dict[str, float]:
    """Model error against search error (Stahlberg and Byrne 2019): on the sentences scored both ways,
    the share whose reference the model scores higher than the hypothesis beam search found (a search
    error: the model prefers the reference, the beam missed it), and both mean scores."""
    ids = sorted(set(hypotheses) & set(references))
    if not ids:
        return {"sentences": 0}
    missed = sum(references[i] > hypotheses[i] for i in ids)
    return {"sentences": len(ids), "search_error_share": round(missed / len(ids), 4),
            "mean_hypothesis_score": round(sum(hypotheses[i] for i in ids) / len(ids), 4),
            "mean_reference_score": round(sum(references[i] for i in ids) / len(ids), 4)}
