"""The residual streams' write, H'_j = b_j y + (sum_i r_ij H_i - b_j h): the eager reference, and one fused operator
each way (``capsagg::stream_write``: one Triton kernel on CUDA, :mod:`.stream_write_triton`; the reference inside
the operator elsewhere). ``--connection-kernels`` picks; both compute the same values and gradients."""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .fused import triton_kernels


def write_reference(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor) -> Tensor:
    """H' (..., n, C) from H (..., n, C), r (..., n, n) or (n, n), b (..., n) or (n), h and y (..., C), in the streams'
    dtype: b_j y + (sum_i r_ij H_i - b_j h), so that at r = I, b = 1 and streams that are copies of h, H'_j = y
    exactly."""
    mix, write = mix.to(streams.dtype), write.to(streams.dtype)
    mixed = torch.einsum("ij,...ic->...jc" if mix.dim() == 2 else "...ij,...ic->...jc", mix, streams)
    kept = mixed - write.unsqueeze(-1) * block_input.unsqueeze(-2)
    return write.unsqueeze(-1) * block_output.unsqueeze(-2) + kept


@torch.library.custom_op("capsagg::stream_write", mutates_args=())
def _fused(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor) -> Tensor:
    kernels = triton_kernels("stream_write_triton", streams)
    if kernels is not None:
        return kernels.forward(streams, mix, write, block_input, block_output)
    return write_reference(streams, mix, write, block_input, block_output)


@_fused.register_fake
def _(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor) -> Tensor:
    return torch.empty_like(streams)


@torch.library.custom_op("capsagg::stream_write_backward", mutates_args=())
def _fused_backward(grad: Tensor, streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor,
                    block_output: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    kernels = triton_kernels("stream_write_triton", streams)
    if kernels is not None:
        return kernels.backward(grad, streams, mix, write, block_input, block_output)
    increment = (block_output - block_input).unsqueeze(-2)
    return (torch.einsum("pij,pjc->pic", mix.to(grad.dtype), grad),
            torch.einsum("pic,pjc->pij", streams, grad).to(mix.dtype),
            (grad * increment).sum(-1).to(write.dtype),
            (write.to(grad.dtype).unsqueeze(-1) * grad).sum(-2))


@_fused_backward.register_fake
def _(grad: Tensor, streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor):
    return torch.empty_like(streams), torch.empty_like(mix), torch.empty_like(write), torch.empty_like(block_input)


def _setup_context(ctx, inputs: Tuple[Tensor, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    grad_streams, grad_mix, grad_write, grad_increment = _fused_backward(grad.contiguous(), *ctx.saved_tensors)
    return grad_streams, grad_mix, grad_write, -grad_increment, grad_increment


_fused.register_autograd(_backward, setup_context=_setup_context)


def write_fused(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor) -> Tensor:
    """:func:`write_reference` as one operator each way: every position's tensors flattened and contiguous, static
    weights expanded to every position (their gradients summed back by the expansion's own backward)."""
    n, channels = streams.shape[-2:]
    positions = streams.numel() // (n * channels)
    flat = [t.reshape(positions, *t.shape[-k:]).contiguous() if t.dim() > k else
            t.expand(positions, *t.shape).contiguous()
            for t, k in ((streams, 2), (mix, 2), (write, 1), (block_input, 1), (block_output, 1))]
    return _fused(*flat).view(streams.shape)


def stream_write(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                 kernel: str = "fused") -> Tensor:
    """The write by the implementation ``kernel`` (``fused`` or ``eager``; the same values)."""
    if kernel == "fused":
        return write_fused(streams, mix, write, block_input, block_output)
    return write_reference(streams, mix, write, block_input, block_output)
