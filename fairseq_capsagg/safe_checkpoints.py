"""Lets torch's ``weights_only=True`` loader read fairseq checkpoints.

torch >= 2.6 unpickles checkpoints with an allow-list of globals. fairseq
checkpoints hold a few objects beyond tensors and containers: the legacy
``argparse.Namespace`` of model arguments, and numpy scalars for metrics such
as the best validation loss. Exactly these are allow-listed; a checkpoint that
carries any other pickled global is still refused by torch.
"""

import argparse
from typing import List

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
