"""Attention over depth's aggregate, H~ = sum_l w_l H^l with w = g softmax_l((q . H^l) / RMS(H^l)) + (1 - g) e_L:
the eager reference and one fused operator each way (``capsagg::depth_softmax``: one Triton kernel on CUDA,
:mod:`..kernels.depth_softmax`; the reference and :func:`reference_backward` inside the operator elsewhere).
``--connection-kernels`` picks; both compute the same values and gradients.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..layer_history import apply_to_stack, put_gradient
from ..numerics import RMS_EPS
from .dispatch import runs_fused, triton_kernels


def depth_weights(layers: Tensor, query: Tensor, gate: Tensor) -> Tensor:
    """w (L, ...) fp32 from the layers (L, ..., C), a query (C) or (..., C) and the gate g: the softmax over depth
    of q . RMSNorm(H^l), computed as (q . H^l) / RMS(H^l), mixed into the one-hot on H^L by g."""
    values = layers.float()
    inverse_rms = torch.rsqrt(values.pow(2).mean(-1) + RMS_EPS)
    scores = values @ query.float() if query.dim() == 1 else (values * query.float()).sum(-1)
    gate = gate.float()
    weights = gate * torch.softmax(scores * inverse_rms, dim=0)
    weights[-1] += 1.0 - gate  # the one-hot on H^L: g alpha_L + (1 - g), g alpha_l elsewhere
    return weights


def aggregate_reference(layers: Tensor, query: Tensor, gate: Tensor) -> Tensor:
    """H~ (..., C) in the layers' dtype: sum_l w_l H^l with w = :func:`depth_weights`; at g = 0 exactly H^L."""
    return (layers * depth_weights(layers, query, gate).to(layers.dtype).unsqueeze(-1)).sum(0)


def reference_backward(grad: Tensor, layers: Tensor, query: Tensor, gate: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`aggregate_reference`'s layers (L, P, C), query (C) or (P, C) and gate from that
    of H~ (P, C), written out (autograd's values, without its graph), with s_l = d_l r_l, d_l = q . H^l,
    r_l = 1 / RMS(H^l) and alpha = softmax(s)."""
    values, grad = layers.float(), grad.float()
    per_position = query.float() if query.dim() == 2 else query.float().expand(values.shape[1:])
    inverse_rms = torch.rsqrt(values.pow(2).mean(-1) + RMS_EPS)  # (L, P)
    dots = (values * per_position).sum(-1)
    attention = torch.softmax(dots * inverse_rms, dim=0)
    g = gate.float()
    weights = g * attention
    weights[-1] += 1.0 - g
    grad_weights = (values * grad).sum(-1)  # (L, P)
    newest = torch.zeros_like(attention)
    newest[-1] = 1.0
    grad_gate = (grad_weights * (attention - newest)).sum()
    grad_attention = g * grad_weights
    grad_scores = attention * (grad_attention - (attention * grad_attention).sum(0, keepdim=True))
    grad_dots, grad_inverse_rms = grad_scores * inverse_rms, grad_scores * dots
    grad_layers = (weights.unsqueeze(-1) * grad + grad_dots.unsqueeze(-1) * per_position
                   - (grad_inverse_rms * inverse_rms.pow(3) / values.size(-1)).unsqueeze(-1) * values)
    grad_query = (grad_dots.unsqueeze(-1) * values).sum(0)
    if query.dim() == 1:
        grad_query = grad_query.sum(0)
    return grad_layers.to(layers.dtype), grad_query.to(query.dtype), grad_gate.to(gate.dtype)


@torch.library.custom_op("capsagg::depth_softmax", mutates_args=())
def _fused(layers: Tensor, query: Tensor, gate: Tensor) -> Tensor:
    kernels = triton_kernels(__name__, layers)
    if kernels is not None:
        return kernels.forward(layers, query, gate, RMS_EPS)
    return aggregate_reference(layers, query, gate)


@_fused.register_fake
def _(layers: Tensor, query: Tensor, gate: Tensor) -> Tensor:
    return layers.new_empty(layers.shape[1:])


@torch.library.custom_op("capsagg::depth_softmax_backward", mutates_args=("grad_layers",))
def _fused_backward(grad: Tensor, layers: Tensor, query: Tensor, gate: Tensor, grad_layers: Tensor,
                    accumulate: bool) -> Tuple[Tensor, Tensor]:
    """The gradients of the query and the gate; the layers' written into ``grad_layers``, or added to it."""
    kernels = triton_kernels(__name__, layers)
    if kernels is not None:
        return kernels.backward(grad, layers, query, gate, RMS_EPS, grad_layers, accumulate)[1:]
    grad_of_layers, grad_query, grad_gate = reference_backward(grad, layers, query, gate)
    put_gradient(grad_layers, grad_of_layers, accumulate)
    return grad_query, grad_gate


@_fused_backward.register_fake
def _(grad: Tensor, layers: Tensor, query: Tensor, gate: Tensor, grad_layers: Tensor,
      accumulate: bool) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(query), torch.empty_like(gate)


def _backward_into(grad: Tensor, layers: Tensor, query: Tensor, gate: Tensor, target: Tensor,
                   fresh: bool) -> Tuple[Tensor, Tensor]:
    """The backward of a :class:`~.layer_history.LayerHistory`'s stack: the layers' gradient put into ``target``."""
    return _fused_backward(grad.contiguous(), layers, query, gate, target, not fresh)


def _setup_context(ctx, inputs: Tuple[Tensor, Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    layers, query, gate = ctx.saved_tensors
    grad_layers = torch.empty_like(layers)
    return (grad_layers, *_fused_backward(grad.contiguous(), layers, query, gate, grad_layers, False))


_fused.register_autograd(_backward, setup_context=_setup_context)


def depth_softmax(layers: Tensor, query: Tensor, gate: Tensor, kernel: str = "auto") -> Tensor:
    """:func:`aggregate_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`) for layers
    (L, ..., C) and a query (C) or (..., C). The fused operator reads the query and the gate in their precision
    (a bf16 model's bf16) and computes in fp32, so that no cast of them runs each way; on a
    :class:`~.layer_history.LayerHistory`'s stack its backward puts the layers' gradient into the history's."""
    if not runs_fused(kernel, layers):
        return aggregate_reference(layers, query, gate)
    num_layers, channels = layers.size(0), layers.size(-1)
    positions = layers[0].numel() // channels
    flat_query = query if query.dim() == 1 else query.reshape(positions, channels)
    inputs = (layers.reshape(num_layers, positions, channels).contiguous(), flat_query.contiguous(), gate)
    out = apply_to_stack(layers, _fused, _backward_into, *inputs)
    return out.view(layers.shape[1:])
