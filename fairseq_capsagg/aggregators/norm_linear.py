"""act(RMSNorm(x) W^T) in fp32, the dynamic weights of hyper-connections and mHC where their reads are not fused (the
fused reads compute them inside their operators: :mod:`.hyper_read`, :mod:`.mhc_read`)."""

import torch
import torch.nn.functional as F
from torch import Tensor

from .normalisation import rms_normalise


def norm_linear_reference(x: Tensor, weight: Tensor, tanh: bool) -> Tensor:
    """(..., K) fp32: RMSNorm(x) W^T over x's last dimension, through tanh when ``tanh``."""
    out = F.linear(rms_normalise(x), weight.float())
    return torch.tanh(out) if tanh else out
