"""act(RMSNorm(x) W^T) in fp32, the dynamic weights of hyper-connections and mHC: the eager reference, and one fused
operator each way (``capsagg::norm_linear``: one Triton kernel on CUDA, :mod:`.norm_linear_triton`; the reference
inside the operator elsewhere). ``--connection-kernels`` picks; both compute the same values and gradients."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .fused import runs_fused, triton_kernels
from .normalisation import RMS_EPS, rms_normalise


def norm_linear_reference(x: Tensor, weight: Tensor, tanh: bool) -> Tensor:
    """(..., K) fp32: RMSNorm(x) W^T over x's last dimension, through tanh when ``tanh``."""
    out = F.linear(rms_normalise(x), weight.float())
    return torch.tanh(out) if tanh else out


@torch.library.custom_op("capsagg::norm_linear", mutates_args=())
def _fused(x: Tensor, weight: Tensor, tanh: bool) -> Tensor:
    kernels = triton_kernels("norm_linear_triton", x)
    if kernels is not None:
        return kernels.forward(x, weight, RMS_EPS, tanh)
    return norm_linear_reference(x, weight, tanh)


@_fused.register_fake
def _(x: Tensor, weight: Tensor, tanh: bool) -> Tensor:
    return x.new_empty(x.size(0), weight.size(0), dtype=torch.float32)


@torch.library.custom_op("capsagg::norm_linear_backward", mutates_args=())
def _fused_backward(grad: Tensor, x: Tensor, weight: Tensor, out: Tensor, tanh: bool) -> Tuple[Tensor, Tensor]:
    kernels = triton_kernels("norm_linear_triton", x)
    if kernels is not None:
        return kernels.backward(grad, x, weight, out, RMS_EPS, tanh)
    if tanh:
        grad = grad * (1 - out * out)
    values = x.float()
    inverse_rms = torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    normed = values * inverse_rms
    grad_normed = grad @ weight
    grad_x = inverse_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    return grad_x.to(x.dtype), grad.t() @ normed


@_fused_backward.register_fake
def _(grad: Tensor, x: Tensor, weight: Tensor, out: Tensor, tanh: bool) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(weight)


def _setup_context(ctx, inputs: Tuple[Tensor, Tensor, bool], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0], inputs[1], output)
    ctx.tanh = inputs[2]


def _backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    x, weight, out = ctx.saved_tensors
    grad_x, grad_weight = _fused_backward(grad.contiguous(), x, weight, out, ctx.tanh)
    return grad_x, grad_weight, None


_fused.register_autograd(_backward, setup_context=_setup_context)


def norm_linear(x: Tensor, weight: Tensor, tanh: bool, kernel: str = "auto") -> Tensor:
    """:func:`norm_linear_reference` by the implementation ``kernel`` (:func:`.fused.runs_fused`)."""
    if not runs_fused(kernel, x):
        return norm_linear_reference(x, weight, tanh)
    rows = x.reshape(-1, x.size(-1)).contiguous()
    return _fused(rows, weight.float().contiguous(), tanh).view(*x.shape[:-1], weight.size(0))
