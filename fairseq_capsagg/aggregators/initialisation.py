"""Initialisation of stacked weights: each matrix by its own fan-in and fan-out."""

import math

import torch
from torch import Tensor


@torch.no_grad()
def xavier_uniform_per_matrix_(weight: Tensor, gain: float = 1.0) -> Tensor:
    """Glorot-uniform initialisation of every trailing (out, in) matrix of ``weight`` on its own.

    ``torch.nn.init.xavier_uniform_`` on a tensor of shape (L, out, in) takes
    fan-in and fan-out over the whole tensor (in * out and L * out), so each
    of the L matrices would start sqrt(L * out / ...) times too small; here
    every matrix W of shape (out, in) is drawn from U(-a, a) with
    a = gain * sqrt(6 / (in + out)), as a single ``nn.Linear`` would be.

    Args:
        weight: a tensor of shape (..., out, in); filled in place.
        gain: scales the bound (``torch.nn.init`` convention).
    """
    if weight.dim() < 2:
        raise ValueError(f"expected a tensor of matrices, got shape {tuple(weight.shape)}")
    fan_out, fan_in = weight.shape[-2:]
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return weight.uniform_(-bound, bound)
