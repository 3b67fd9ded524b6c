"""A MUDD connection, Omega_s = sum_l w_{s,l} H^l with w = W_2 GELU(W_1 RMSNorm(H^L)) + b per position: the eager
reference and one fused operator each way (``capsagg::mudd_aggregate``: Triton kernels on CUDA,
:mod:`..kernels.mudd_aggregate`; the reference and :func:`reference_backward` inside the operator elsewhere).
``--connection-kernels`` picks; both compute the same values and gradients.
"""

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layer_history import apply_to_stack, put_gradient
from ..numerics import RMS_EPS, rms_normalise
from .dispatch import runs_fused, triton_kernels


def mudd_weights(newest: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor) -> Tensor:
    """w (..., S, L) fp32 from the newest layer H^L (..., C), W_1 (H, C), W_2 (S L, H) and b (S, L)."""
    hidden = F.gelu(F.linear(rms_normalise(newest), fc1.float()))
    return F.linear(hidden, fc2.float()).unflatten(-1, tuple(static.shape)) + static.float()


def aggregate_reference(layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor) -> Tensor:
    """Omega (S, ..., C) in the layers' dtype from the layers (L, ..., C), depth first."""
    weights = mudd_weights(layers[-1], fc1, fc2, static).to(layers.dtype)
    return torch.einsum("l...c,...sl->s...c", layers, weights)


def gelu_derivative(x: Tensor) -> Tensor:
    """d GELU(x) / dx = Phi(x) + x phi(x), GELU's exact (erf) form."""
    return 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def reference_backward(grad: Tensor, layers: Tensor, fc1: Tensor, fc2: Tensor,
                       static: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`aggregate_reference`'s layers (L, P, C), W_1, W_2 and b from that of Omega
    (S, P, C), written out (autograd's values, without its graph); computed in fp32, each returned in its input's
    precision."""
    values, grad = layers.float(), grad.float()
    newest = values[-1]
    inverse_rms = torch.rsqrt(newest.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    normed = newest * inverse_rms
    pre = normed @ fc1.float().t()
    hidden = F.gelu(pre)
    weights = (hidden @ fc2.float().t()).unflatten(-1, tuple(static.shape)) + static.float()  # (P, S, L)
    grad_weights = torch.einsum("spc,lpc->psl", grad, values)
    grad_layers = torch.einsum("psl,spc->lpc", weights, grad)
    flat = grad_weights.flatten(1)
    grad_pre = (flat @ fc2.float()) * gelu_derivative(pre)
    grad_normed = grad_pre @ fc1.float()
    grad_layers[-1] += inverse_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    return (grad_layers.to(layers.dtype), (grad_pre.t() @ normed).to(fc1.dtype), (flat.t() @ hidden).to(fc2.dtype),
            grad_weights.sum(0).to(static.dtype))


def saved_sums(layers: Tensor, fc1: Tensor) -> Tuple[Tensor, Tensor]:
    """W_1 RMSNorm(H^L) (P, H), the MLP's pre-activation, and 1/RMS(H^L) (P), fp32, for layers (L, P, C): what the
    fused forward stores for its backward (whose RMSNorm gradient needs mean(g . normed) = G . pre / C)."""
    newest = layers[-1].float()
    return F.linear(rms_normalise(newest), fc1.float()), torch.rsqrt(newest.pow(2).mean(-1) + RMS_EPS)


@torch.library.custom_op("capsagg::mudd_aggregate", mutates_args=())
def _fused(layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    kernels = triton_kernels(__name__, layers)
    if kernels is not None:
        return kernels.forward(layers, fc1, fc2, static, RMS_EPS)
    # the einsum's output may be strided; the fake's is not
    return (aggregate_reference(layers, fc1, fc2, static).contiguous(), *saved_sums(layers, fc1))


@_fused.register_fake
def _(layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    positions = layers.size(1)
    return (layers.new_empty(static.size(0), *layers.shape[1:]),
            layers.new_empty(positions, fc1.size(0), dtype=torch.float32),
            layers.new_empty(positions, dtype=torch.float32))


@torch.library.custom_op("capsagg::mudd_aggregate_backward", mutates_args=("grad_layers",))
def _fused_backward(grad: Tensor, layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor, pre: Tensor,
                    inverse_rms: Tensor, grad_layers: Tensor, accumulate: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of W_1, W_2 and b; the layers' written into ``grad_layers``, or added to it."""
    kernels = triton_kernels(__name__, layers)
    if kernels is not None:
        return kernels.backward(grad, layers, fc1, fc2, static, pre, inverse_rms, grad_layers, accumulate)[1:]
    grad_of_layers, *grads = reference_backward(grad, layers, fc1, fc2, static)
    put_gradient(grad_layers, grad_of_layers, accumulate)
    return tuple(grads)


@_fused_backward.register_fake
def _(grad: Tensor, layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor, pre: Tensor, inverse_rms: Tensor,
      grad_layers: Tensor, accumulate: bool) -> Tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(fc1), torch.empty_like(fc2), torch.empty_like(static)


def _backward_into(grad: Tensor, layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor, pre: Tensor,
                   inverse_rms: Tensor, target: Tensor, fresh: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """The backward of a :class:`~.layer_history.LayerHistory`'s stack: the layers' gradient put into ``target``."""
    return _fused_backward(grad.contiguous(), layers, fc1, fc2, static, pre, inverse_rms, target, not fresh)


def _setup_context(ctx, inputs: Tuple[Tensor, Tensor, Tensor, Tensor], output: Tuple[Tensor, Tensor, Tensor]) -> None:
    ctx.mark_non_differentiable(*output[1:])
    ctx.save_for_backward(*inputs, *output[1:])


def _backward(ctx, grad: Tensor, *unused: Tensor) -> Tuple[Optional[Tensor], ...]:
    layers, *rest = ctx.saved_tensors
    grad_layers = torch.empty_like(layers)
    return (grad_layers, *_fused_backward(grad.contiguous(), layers, *rest, grad_layers, False))


_fused.register_autograd(_backward, setup_context=_setup_context)


def mudd_aggregate(layers: Tensor, fc1: Tensor, fc2: Tensor, static: Tensor, kernel: str = "auto") -> Tensor:
    """:func:`aggregate_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`) for layers
    (L, ..., C): Omega (S, ..., C). The fused operator reads the weights in their precision (a bf16 model's bf16)
    and computes in fp32, so that no cast of them runs each way; on a :class:`~.layer_history.LayerHistory`'s stack
    its backward puts the layers' gradient into the history's."""
    if not runs_fused(kernel, layers):
        return aggregate_reference(layers, fc1, fc2, static)
    num_layers, channels = layers.size(0), layers.size(-1)
    inputs = (layers.reshape(num_layers, -1, channels).contiguous(), fc1.contiguous(), fc2.contiguous(),
              static.contiguous())
    out = apply_to_stack(layers, _fused, _backward_into, *inputs)
    return out.view(static.size(0), *layers.shape[1:])
