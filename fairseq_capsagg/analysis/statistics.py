"""Entropy and diversity of routing agreement (Eqs. 18-19 of Dou et al. 2019).

Eqs. 18-19 as printed do not reproduce the paper's own numbers: Eq. 18 has no
minus sign and averages over N*L cells, yet the reported first-iteration
entropy 6.24 is ln 512, the entropy of a uniform distribution over N = 512
output capsules; and Eq. 19 averages cosines, yet the reported first-iteration
diversity 0.00 arises for identical (uniform) agreement vectors, whose cosine
is 1. The definitions that reproduce the reported values are used:

* entropy = mean over input capsules l of -sum_n C_{l->n} log C_{l->n}
  (ln N for uniform agreement, 0 for one-hot agreement);
* diversity = 1 - mean over pairs i < j of cos(C_i, C_j), where
  C_n = (C_{1->n}, ..., C_{L->n}) (0 for uniform agreement, 1 when every input
  capsule is routed to its own output capsule). An all-zero C_n has cosine 0
  with every other vector.

Both are computed at every position and averaged over real positions.
"""

import torch
from torch import Tensor

_EPS = 1e-12


def agreement_entropy(agreement: Tensor) -> Tensor:
    """(..., L, N) agreement -> (...) entropy averaged over input capsules."""
    c = agreement.double()
    return -(c * torch.log(c.clamp_min(_EPS))).sum(-1).mean(-1)


def agreement_diversity(agreement: Tensor) -> Tensor:
    """(..., L, N) agreement -> (...) one minus the mean pairwise cosine of the columns C_n.

    Uses sum_{i != j} cos(C_i, C_j) = |sum_n u_n|^2 - sum_n |u_n|^2 with unit
    columns u_n, so it costs O(L N) per position instead of O(L N^2).
    """
    c = agreement.double()
    n = c.shape[-1]
    if n < 2:
        return torch.zeros(c.shape[:-2], dtype=torch.double)
    norms = c.norm(dim=-2, keepdim=True)
    unit = torch.where(norms > _EPS, c / norms.clamp_min(_EPS), torch.zeros_like(c))
    pair_sum = unit.sum(-1).pow(2).sum(-1) - unit.pow(2).sum((-1, -2))
    return (1.0 - pair_sum / (n * (n - 1))).clamp_min(0.0)  # rounding can dip below 0
