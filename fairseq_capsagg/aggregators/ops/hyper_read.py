"""A hyper-connection's read: its dynamic weights (a, r, b) and the block's input h = sum_i a_i H_i, the eager
reference and one fused operator each way (``capsagg::hyper_read``: Triton kernels on CUDA,
:mod:`..kernels.hyper_read`; the reference and :func:`reference_backward` inside the operator elsewhere).
``--connection-kernels`` picks; both compute the same values and gradients.

With G = tanh(RMSNorm(H) W^T), (n, n + 2) per position (Zhu et al.'s DHC, Eqs. 10-13):
a_i = A_m,i + s_a G_i0, r_ij = A_r,ij + s_a G_i(1+j), b_i = B_i + s_b G_i(n+1).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..numerics import RMS_EPS, norm_linear_reference, rms_normalise
from .dispatch import runs_fused, triton_kernels

#: The gradients of the streams, the projection, A_m, A_r, B, s_a and s_b.
GRADIENTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
#: The fused operator's outputs: h, r and b, then what its backward reads, D and 1/RMS.
OUTPUTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def read_reference(streams: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor,
                   static_write: Tensor, read_mix_scale: Tensor, write_scale: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """h (..., C) in the streams' dtype, r (..., n, n) and b (..., n) in fp32, from the streams H (..., n, C), the
    projection [W_a; W_b] (n + 2, C), the static A_m (n), A_r (n, n), B (n) and the scales s_a, s_b."""
    gates = norm_linear_reference(streams, projection, tanh=True)
    read_mix = gates[..., :-1] * read_mix_scale.float()
    read = static_read.float() + read_mix[..., 0]
    mix = static_mix.float() + read_mix[..., 1:]
    write = static_write.float() + write_scale.float() * gates[..., -1]
    return (read.to(streams.dtype).unsqueeze(-1) * streams).sum(-2), mix, write


def saved_sums(streams: Tensor, projection: Tensor) -> Tuple[Tensor, Tensor]:
    """D = RMSNorm(H_i) W^T (P, n, n + 2) and 1/RMS of each stream (P, n), fp32, for streams (P, n, C): what the
    fused forward stores for its backward (whose RMSNorm gradient needs mean(g . normed) = G' . D / C)."""
    x = streams.float()
    return F.linear(rms_normalise(x), projection.float()), torch.rsqrt(x.pow(2).mean(-1) + RMS_EPS)


def saved_fakes(streams: Tensor) -> Tuple[Tensor, Tensor]:
    """D and 1/RMS as the fused forwards return them, for their fake implementations."""
    positions, n, _ = streams.shape
    return (streams.new_empty(positions, n, n + 2, dtype=torch.float32),
            streams.new_empty(positions, n, dtype=torch.float32))


def reference_backward(grad_read: Tensor, grad_mix: Tensor, grad_write: Tensor, streams: Tensor, projection: Tensor,
                       static_read: Tensor, read_mix_scale: Tensor, write_scale: Tensor) -> GRADIENTS:
    """The gradients of :func:`read_reference`'s inputs (the streams, the projection, A_m, A_r, B, s_a, s_b) from
    those of h (P, C), r (P, n, n) and b (P, n), for streams (P, n, C), written out (autograd's values, without
    its graph): through the read, then the gates' affine maps, tanh and RMSNorm(H) W^T. Computed in fp32, each
    returned in its input's precision."""
    x, weight = streams.float(), projection.float()
    inverse_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    normed = x * inverse_rms
    gates = torch.tanh(normed @ weight.t())  # (P, n, n + 2)
    scale_a, scale_b = read_mix_scale.float(), write_scale.float()
    read = static_read.float() + scale_a * gates[..., 0]
    grad_read = grad_read.float()
    grad_a = torch.einsum("pc,pic->pi", grad_read, x)
    grad_gates = torch.cat([scale_a * grad_a.unsqueeze(-1), scale_a * grad_mix, scale_b * grad_write.unsqueeze(-1)],
                           -1)
    grad_scale_a = (gates[..., 0] * grad_a).sum() + (gates[..., 1:-1] * grad_mix).sum()
    grad_scale_b = (gates[..., -1] * grad_write).sum()
    grad_pre = grad_gates * (1 - gates * gates)
    grad_normed = grad_pre @ weight
    grad_x = inverse_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    grad_x = grad_x + read.unsqueeze(-1) * grad_read.unsqueeze(-2)
    grad_projection = grad_pre.flatten(0, 1).t() @ normed.flatten(0, 1)
    static = static_read.dtype  # A_m's, A_r's and B's
    return (grad_x.to(streams.dtype), grad_projection.to(projection.dtype), grad_a.sum(0).to(static),
            grad_mix.sum(0).to(static), grad_write.sum(0).to(static), grad_scale_a.to(read_mix_scale.dtype),
            grad_scale_b.to(write_scale.dtype))


@torch.library.custom_op("capsagg::hyper_read", mutates_args=())
def _fused(streams: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor, static_write: Tensor,
           read_mix_scale: Tensor, write_scale: Tensor) -> OUTPUTS:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.forward(streams, projection, static_read, static_mix, static_write, read_mix_scale,
                               write_scale, RMS_EPS)
    return (*read_reference(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale),
            *saved_sums(streams, projection))


@_fused.register_fake
def _(streams: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor, static_write: Tensor,
      read_mix_scale: Tensor, write_scale: Tensor) -> OUTPUTS:
    positions, n, channels = streams.shape
    return (streams.new_empty(positions, channels), streams.new_empty(positions, n, n, dtype=torch.float32),
            streams.new_empty(positions, n, dtype=torch.float32), *saved_fakes(streams))


@torch.library.custom_op("capsagg::hyper_read_backward", mutates_args=())
def _fused_backward(grad_read: Tensor, grad_mix: Tensor, grad_write: Tensor, streams: Tensor, projection: Tensor,
                    static_read: Tensor, read_mix_scale: Tensor, write_scale: Tensor, dynamic: Tensor,
                    inverse_rms: Tensor) -> GRADIENTS:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale,
                                write_scale, dynamic, inverse_rms)
    return reference_backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale,
                              write_scale)


@_fused_backward.register_fake
def _(grad_read: Tensor, grad_mix: Tensor, grad_write: Tensor, streams: Tensor, projection: Tensor,
      static_read: Tensor, read_mix_scale: Tensor, write_scale: Tensor, dynamic: Tensor,
      inverse_rms: Tensor) -> GRADIENTS:
    n = streams.size(1)
    scalar = read_mix_scale.new_empty(())
    return (torch.empty_like(streams), torch.empty_like(projection), static_read.new_empty(n),
            static_read.new_empty(n, n), static_read.new_empty(n), scalar, scalar.clone())


def _setup_context(ctx, inputs: Tuple[Tensor, ...], output: OUTPUTS) -> None:
    streams, projection, static_read, _, _, read_mix_scale, write_scale = inputs
    ctx.mark_non_differentiable(*output[3:])
    ctx.save_for_backward(streams, projection, static_read, read_mix_scale, write_scale, *output[3:])


def _backward(ctx, grad_read: Tensor, grad_mix: Tensor, grad_write: Tensor, *unused: Tensor) -> Tuple[Optional[Tensor],
                                                                                                      ...]:
    return _fused_backward(grad_read.contiguous(), grad_mix.float().contiguous(), grad_write.float().contiguous(),
                           *ctx.saved_tensors)


_fused.register_autograd(_backward, setup_context=_setup_context)


def hyper_read(streams: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor, static_write: Tensor,
               read_mix_scale: Tensor, write_scale: Tensor, kernel: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`read_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`), for streams (..., n, C):
    h (..., C), r (..., n, n) and b (..., n). The fused operator reads the weights in their precision (a bf16
    model's bf16) and computes in fp32, so that no cast of them runs each way."""
    if not runs_fused(kernel, streams):
        return read_reference(streams, projection, static_read, static_mix, static_write, read_mix_scale,
                              write_scale)
    n, channels = streams.shape[-2:]
    batch = streams.shape[:-2]
    read, mix, write, _, _ = _fused(streams.reshape(-1, n, channels).contiguous(), projection.contiguous(),
                                    static_read, static_mix.contiguous(), static_write, read_mix_scale, write_scale)
    return read.view(*batch, channels), mix.view(*batch, n, n), write.view(*batch, n)
