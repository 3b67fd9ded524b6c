"""Figures of the analyses (matplotlib, Agg backend)."""

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
logging.getLogger("matplotlib").setLevel(logging.WARNING)
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402


def save(fig, path: Path) -> None:
    """Writes ``fig`` to ``path`` (PNG, 110 dpi) and closes it."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_heatmaps(agreement: List[torch.Tensor], path: Path, title: str, stats: Dict[str, object]) -> None:
    """One panel per routing iteration: input capsules (rows) x output capsules (columns)."""
    iters = len(agreement)
    fig, axes = plt.subplots(iters, 1, figsize=(10, 1.6 + 1.4 * iters), squeeze=False)
    vmax = max(float(a.max()) for a in agreement)
    for it, (ax, a) in enumerate(zip(axes[:, 0], agreement)):
        image = ax.imshow(a.numpy(), aspect="auto", cmap="Greys", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_ylabel("input capsule l")
        ax.set_yticks(range(a.shape[0]), [str(i + 1) for i in range(a.shape[0])])
        ax.set_title(f"iteration {it + 1}: entropy {stats['entropy'][it]:.2f}, "
                     f"diversity {stats['diversity'][it]:.2f}", fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.02, pad=0.01)
    axes[-1, 0].set_xlabel("output capsule n")
    fig.suptitle(title)
    save(fig, path)


def plot_depth_weights(connections: List[Dict[str, object]], path: Path, title: str) -> None:
    """One panel per stream: connections (rows, the newest block last) x inputs (columns, the
    embedding or H^1 first); a connection's inputs beyond its own count are blank."""
    names = list(dict.fromkeys(name for c in connections for name in c["streams"]))
    width = max(c["inputs"] for c in connections)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 0.5 * len(connections) + 2), squeeze=False)
    for ax, name in zip(axes[0], names):
        grid = torch.full((len(connections), width), float("nan"))
        for row, c in enumerate(connections):
            if name in c["streams"]:
                grid[row, : c["inputs"]] = torch.tensor(c["streams"][name])
        image = ax.imshow(grid.numpy(), aspect="auto", cmap="coolwarm", vmin=-1.0, vmax=1.0, interpolation="nearest")
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(width))
        ax.set_yticks(range(len(connections)))
        ax.set_xlabel("input (0: the first one read)")
        ax.set_ylabel("connection (0: the first)")
        fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02)
    fig.suptitle(title, fontsize=10)
    save(fig, path)


def plot_series(x_labels: Sequence[str], series: Dict[str, Sequence[float]], path: Path, title: str,
                xlabel: str, ylabel: str = "BLEU") -> None:
    """Lines of one value per x label, one line per system."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in series.items():
        ax.plot(range(len(x_labels)), values, marker="o", label=name)
    ax.set_xticks(range(len(x_labels)), list(x_labels))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    save(fig, path)


def plot_validation_curves(curves: Dict[str, Dict[str, Tuple[Sequence[float], Sequence[float]]]], path: Path,
                           target: Optional[float] = None, reference: str = "converged Transformer") -> None:
    """Validation loss curves, one panel per x axis: ``curves[axis][name] = (x, loss)`` for the axes
    ``updates`` and ``seconds`` (rows from scratch) and ``continued`` (further updates of warm starts);
    ``target``, when given, is drawn as a dashed line (the best loss of ``reference``, where the warm starts
    start)."""
    titles = {"updates": ("from scratch", "updates"),
              "seconds": ("from scratch", "seconds of training at idle speed"),
              "continued": (f"continued from the {reference}", "further updates")}
    axes_used = [axis for axis in titles if curves.get(axis)]
    fig, axes = plt.subplots(1, max(1, len(axes_used)), figsize=(5.5 * max(1, len(axes_used)), 4.5), squeeze=False)
    for ax, axis in zip(axes[0], axes_used):
        for name, (x, loss) in curves[axis].items():
            ax.plot(x, loss, marker=".", linewidth=1, label=name)
        if target is not None and axis != "continued":
            ax.axhline(target, color="black", linestyle="--", linewidth=0.8, label=f"{reference} ({target:.3f})")
        title, xlabel = titles[axis]
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (bits per token)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, path)


def plot_ratio_curves(lines: Dict[str, Tuple[Sequence[int], Sequence[float]]], band: Dict[int, Tuple[float, float]],
                      path: Path) -> None:
    """Compute-equivalence (the Transformer's updates over a row's for the same validation loss) against the row's
    updates, one line per row, the Transformer's run-to-run band shaded and 1 (no saving) dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if band:
        updates = sorted(band)
        ax.fill_between(updates, [band[u][0] for u in updates], [band[u][1] for u in updates], color="grey",
                        alpha=0.3, label="Transformer against its other run")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    for name, (x, y) in lines.items():
        ax.plot(x, y, marker="o", label=name)
    ax.set(xlabel="updates of the row", ylabel="Transformer's updates / row's", title="compute-equivalence from scratch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)
