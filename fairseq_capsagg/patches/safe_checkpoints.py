"""Lets torch's ``weights_only=True`` loader read fairseq checkpoints.

torch >= 2.6 unpickles checkpoints with an allow-list of globals. fairseq
checkpoints hold a few objects beyond tensors and containers: the legacy
``argparse.Namespace`` of model arguments, and numpy scalars for metrics such
as the best validation loss. Exactly these are allow-listed; a checkpoint that
carries any other pickled global is still refused by torch.
"""

import argparse
from pathlib import Path
from typing import List, Union

import numpy as np
import torch


def _numpy_multiarray():
    try:
        from numpy._core import multiarray  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core import multiarray
    return multiarray


def fairseq_checkpoint_globals() -> List[object]:
    """The globals that fairseq writes into its checkpoints."""
    return [
        argparse.Namespace,
        _numpy_multiarray().scalar,
        np.dtype,
        type(np.dtype(np.float64)),
        type(np.dtype(np.float32)),
        type(np.dtype(np.int64)),
    ]


def allow_fairseq_checkpoint_globals() -> None:
    """Adds :func:`fairseq_checkpoint_globals` to torch's safe globals."""
    torch.serialization.add_safe_globals(fairseq_checkpoint_globals())


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint holds pickled globals that fairseq checkpoints never contain."""


def check_checkpoint(path: Union[str, Path]) -> None:
    """Refuses a checkpoint whose pickle names globals beyond the allow-list.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        UnsafeCheckpointError: naming every unexpected global.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in fairseq_checkpoint_globals()}
    allowed |= {f"{g.__module__}.{g.__name__}" for g in fairseq_checkpoint_globals()}
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except Exception as e:  # noqa: BLE001 (whatever the inspection trips on, the file is not loaded)
        raise UnsafeCheckpointError(f"refusing to load {path}: its pickle cannot be inspected ({e})") from e
    unexpected = [g for g in found if g not in allowed and g.replace("numpy.core.", "numpy._core.") not in allowed]
    if unexpected:
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it pickles {', '.join(sorted(unexpected))}, which fairseq "
            "checkpoints never contain. Load it only if you trust its origin "
            "(torch.load(..., weights_only=False)).")
