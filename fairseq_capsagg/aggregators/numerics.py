"""The numerics the methods, their operators and their kernels share: the constants that keep routing and RMS
normalisation finite in fp32, the squash of the routing's output capsules (Eq. 6), the votes' layout the fused
routing operators read, and the RMS-normalised linear map of the peers' dynamic weights."""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

#: Added under square roots and logarithms; routing runs in fp32, where it is exact enough.
ROUTING_EPS = 1e-6

#: Floor of EM routing's per-dimension variance (sigma_n^h)^2 (Eq. 14).
VARIANCE_FLOOR = 1e-4

#: log sqrt(2 pi), of EM routing's Gaussian cost and log-likelihood (Eqs. 15-16).
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

#: Survives half precision: the normalisation runs in fp32.
RMS_EPS = 1e-6


def squash(s: Tensor, dim: int = -1) -> Tensor:
    """Omega = |S|^2 / (1 + |S|^2) * S / |S| (Eq. 6).

    The norm is taken as sqrt(|S|^2 + eps), which keeps the output and its
    gradient finite when S = 0 and leaves |Omega| < 1.
    """
    sq_norm = s.pow(2).sum(dim=dim, keepdim=True)
    return s * (sq_norm / (1.0 + sq_norm) / torch.sqrt(sq_norm + ROUTING_EPS))


def votes_by_position(votes: Tensor) -> Tensor:
    """Votes (..., L, N, D) as (P, L, N, D) for the fused routing operators, which read them where they are:
    positions first, or layers first as the votes' product over layers (Eq. 8) leaves them; copied otherwise."""
    flat = votes.reshape(-1, *votes.shape[-3:])
    if flat.is_contiguous() or flat.transpose(0, 1).is_contiguous():
        return flat
    return flat.contiguous()


def rms_normalise(x: Tensor) -> Tensor:
    """x / RMS(x) over the last dimension, computed and returned in fp32 (without a learned scale, as the peers'
    keys and weight generators read layers)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=RMS_EPS)


def norm_linear_reference(x: Tensor, weight: Tensor, tanh: bool) -> Tensor:
    """(..., K) fp32: RMSNorm(x) W^T over x's last dimension, through tanh when ``tanh``: the dynamic weights of
    hyper-connections and mHC where their reads are not fused (the fused reads compute them inside their
    operators, :mod:`.ops.hyper_read` and :mod:`.ops.mhc_read`)."""
    out = F.linear(rms_normalise(x), weight.float())
    return torch.tanh(out) if tanh else out
