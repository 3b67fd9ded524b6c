"""mHC's read: its dynamic logits, H_pre, H_post and the block's input h = sum_i H_pre,i H_i, the eager reference and
one fused operator each way (``capsagg::mhc_read``: one Triton kernel on CUDA, :mod:`..kernels.mhc_read`; the
reference and :func:`reference_backward` inside the operator elsewhere). H_res's logits go on to Sinkhorn-Knopp
(:func:`.sinkhorn.mhc_mix`). ``--connection-kernels`` picks; both compute the same values and gradients.

With x~ the RMS-normalised n x C row of a position's streams and D = x~ phi^T (2n + n^2), the logits are
pre = b_pre + alpha_0 D[:n], post = b_post + alpha_1 D[n:2n] and res = b_res + alpha_2 D[2n:] (Eqs. 5-7 of the
paper); with g = clamp(gate, 0, 1) (the identity backward), H_pre = e_home + g (sigmoid(pre) - e_home) and H_post =
2 sigmoid(post) (Eq. 8); with ``shared_gate`` (a checkpoint of the start before, :mod:`..methods.mhc`) H_post =
1 + g (2 sigmoid(post) - 1).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from ..numerics import RMS_EPS, norm_linear_reference
from .dispatch import runs_fused, triton_kernels

#: The gradients of the streams, phi, b_pre, b_post, b_res, alpha and the gate.
GRADIENTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
#: The fused operator's outputs: h, H_res's logits and H_post, then what its backward reads, D and 1/RMS.
OUTPUTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]


def clamped_gate(gate: Tensor) -> Tensor:
    """g = clamp(gate, 0, 1) forward, the identity backward (a gate pushed below 0 can come back), fp32."""
    gate = gate.float()
    return gate + (gate.clamp(0.0, 1.0) - gate).detach()


def read_reference(streams: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor,
                   alpha: Tensor, gate: Tensor, home: int, shared_gate: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """h (..., C) in the streams' dtype, H_res's logits (..., n, n) and H_post (..., n) in fp32, from the streams
    (..., n, C), phi (2n + n^2, n C), the static logits b_pre (n), b_post (n), b_res (n, n), alpha (3), the gate, the
    block's own stream ``home`` and whether the gate also blends H_post (``shared_gate``)."""
    n = streams.size(-2)
    dynamic = norm_linear_reference(streams.flatten(-2), phi, tanh=False)
    alpha = alpha.float()
    pre = pre_logits.float() + alpha[0] * dynamic[..., :n]
    post = post_logits.float() + alpha[1] * dynamic[..., n:2 * n]
    res = res_logits.float() + alpha[2] * dynamic[..., 2 * n:].unflatten(-1, tuple(res_logits.shape))
    g = clamped_gate(gate)
    read = g * torch.sigmoid(pre)
    read[..., home] += 1.0 - g  # e_home + g (sigmoid(pre) - e_home)
    write = 1.0 + g * (2.0 * torch.sigmoid(post) - 1.0) if shared_gate else 2.0 * torch.sigmoid(post)
    return (read.to(streams.dtype).unsqueeze(-1) * streams).sum(-2), res, write


def saved_sums(streams: Tensor, phi: Tensor) -> Tuple[Tensor, Tensor]:
    """D = RMSNorm(row) phi^T (P, 2n + n^2) and 1/RMS of the row (P), fp32, for streams (P, n, C): what the fused
    forward stores for its backward (whose RMSNorm gradient needs mean(g . normed) = G . D / (n C))."""
    flat = streams.float().flatten(1)
    return norm_linear_reference(flat, phi, tanh=False), torch.rsqrt(flat.pow(2).mean(-1) + RMS_EPS)


def reference_backward(grad_read: Tensor, grad_res: Tensor, grad_write: Tensor, streams: Tensor, phi: Tensor,
                       pre_logits: Tensor, post_logits: Tensor, alpha: Tensor, gate: Tensor, home: int,
                       shared_gate: bool) -> GRADIENTS:
    """The gradients of :func:`read_reference`'s inputs from those of h (P, C), H_res's logits (P, n, n) and H_post
    (P, n), for streams (P, n, C), written out (autograd's values, without its graph); computed in fp32, each
    returned in its input's precision (b_res's in b_pre's)."""
    positions, n, channels = streams.shape
    x = streams.float()
    flat = x.reshape(positions, n * channels)
    inverse_rms = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    normed = flat * inverse_rms
    dynamic = normed @ phi.float().t()
    scale = alpha.float()  # alpha_pre, alpha_post, alpha_res
    pre_sigmoid = torch.sigmoid(pre_logits.float() + scale[0] * dynamic[:, :n])
    post_sigmoid = torch.sigmoid(post_logits.float() + scale[1] * dynamic[:, n:2 * n])
    g = gate.float().clamp(0.0, 1.0)
    home_hot = torch.zeros(n, device=streams.device)
    home_hot[home] = 1.0
    read = home_hot + g * (pre_sigmoid - home_hot)
    grad_read = grad_read.float()
    grad_a = torch.einsum("pc,pic->pi", grad_read, x)
    grad_gate = (grad_a * (pre_sigmoid - home_hot)).sum()
    grad_pre = grad_a * g * pre_sigmoid * (1.0 - pre_sigmoid)
    grad_post = grad_write * 2.0 * post_sigmoid * (1.0 - post_sigmoid)
    if shared_gate:
        grad_gate = grad_gate + (grad_write * (2.0 * post_sigmoid - 1.0)).sum()
        grad_post = g * grad_post
    res_shape = grad_res.shape[1:]
    grad_res = grad_res.float().flatten(1)
    grad_alpha = torch.stack([(grad_pre * dynamic[:, :n]).sum(), (grad_post * dynamic[:, n:2 * n]).sum(),
                              (grad_res * dynamic[:, 2 * n:]).sum()])
    grad_dynamic = torch.cat([scale[0] * grad_pre, scale[1] * grad_post, scale[2] * grad_res], -1)
    grad_normed = grad_dynamic @ phi.float()
    grad_flat = inverse_rms * (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True))
    grad_x = grad_flat.view(positions, n, channels) + read.unsqueeze(-1) * grad_read.unsqueeze(-2)
    return (grad_x.to(streams.dtype), (grad_dynamic.t() @ normed).to(phi.dtype), grad_pre.sum(0).to(pre_logits.dtype),
            grad_post.sum(0).to(post_logits.dtype), grad_res.sum(0).view(res_shape).to(pre_logits.dtype),
            grad_alpha.to(alpha.dtype), grad_gate.to(gate.dtype))


def saved_fakes(streams: Tensor, res_width: int) -> Tuple[Tensor, Tensor]:
    """D and 1/RMS as the fused forwards return them (H_res with ``res_width`` parameters), for their fakes."""
    positions, n, _ = streams.shape
    return (streams.new_empty(positions, 2 * n + res_width, dtype=torch.float32),
            streams.new_empty(positions, dtype=torch.float32))


@torch.library.custom_op("capsagg::mhc_read", mutates_args=())
def _fused(streams: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor, alpha: Tensor,
           gate: Tensor, home: int, shared_gate: bool) -> OUTPUTS:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate,
                               RMS_EPS)
    return (*read_reference(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate),
            *saved_sums(streams, phi))


@_fused.register_fake
def _(streams: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor, alpha: Tensor,
      gate: Tensor, home: int, shared_gate: bool) -> OUTPUTS:
    positions, n, channels = streams.shape
    return (streams.new_empty(positions, channels),
            streams.new_empty(positions, *res_logits.shape, dtype=torch.float32),
            streams.new_empty(positions, n, dtype=torch.float32), *saved_fakes(streams, res_logits.numel()))


@torch.library.custom_op("capsagg::mhc_read_backward", mutates_args=())
def _fused_backward(grad_read: Tensor, grad_res: Tensor, grad_write: Tensor, streams: Tensor, phi: Tensor,
                    pre_logits: Tensor, post_logits: Tensor, alpha: Tensor, gate: Tensor, dynamic: Tensor,
                    inverse_rms: Tensor, home: int, shared_gate: bool) -> GRADIENTS:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate,
                                dynamic, inverse_rms, home, shared_gate)
    return reference_backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate,
                              home, shared_gate)


@_fused_backward.register_fake
def _(grad_read: Tensor, grad_res: Tensor, grad_write: Tensor, streams: Tensor, phi: Tensor, pre_logits: Tensor,
      post_logits: Tensor, alpha: Tensor, gate: Tensor, dynamic: Tensor, inverse_rms: Tensor, home: int,
      shared_gate: bool) -> GRADIENTS:
    return (torch.empty_like(streams), torch.empty_like(phi), torch.empty_like(pre_logits),
            torch.empty_like(post_logits), pre_logits.new_empty(grad_res.shape[1:]), torch.empty_like(alpha),
            torch.empty_like(gate))


def _setup_context(ctx, inputs: Tuple, output: OUTPUTS) -> None:
    streams, phi, pre_logits, post_logits, _, alpha, gate, home, shared_gate = inputs
    ctx.mark_non_differentiable(*output[3:])
    ctx.save_for_backward(streams, phi, pre_logits, post_logits, alpha, gate, *output[3:])
    ctx.home = home
    ctx.shared_gate = shared_gate


def _backward(ctx, grad_read: Tensor, grad_res: Tensor, grad_write: Tensor, *unused: Tensor) -> Tuple[Optional[Tensor],
                                                                                                      ...]:
    return (*_fused_backward(grad_read.contiguous(), grad_res.float().contiguous(), grad_write.float().contiguous(),
                             *ctx.saved_tensors, ctx.home, ctx.shared_gate), None, None)


_fused.register_autograd(_backward, setup_context=_setup_context)


def mhc_read(streams: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor,
             alpha: Tensor, gate: Tensor, home: int, shared_gate: bool,
             kernel: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    """:func:`read_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`), for streams (..., n, C):
    h (..., C), H_res's logits (..., n, n) and H_post (..., n). The fused operator reads the weights in their
    precision (a bf16 model's bf16) and computes in fp32, so that no cast of them runs each way."""
    if not runs_fused(kernel, streams):
        return read_reference(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate)
    n, channels = streams.shape[-2:]
    batch = streams.shape[:-2]
    read, res, write, _, _ = _fused(streams.reshape(-1, n, channels).contiguous(), phi.contiguous(), pre_logits,
                                    post_logits, res_logits.contiguous(), alpha, gate, home, shared_gate)
    return read.view(*batch, channels), res.view(*batch, *res_logits.shape), write.view(*batch, n)
