"""The residual streams' write, H'_j = b_j y + (sum_i r_ij H_i - b_j h), and the stack's state after it, the readout
sum_j o_j H'_j: the eager reference, and one fused operator each way (``capsagg::stream_write``: one Triton kernel
on CUDA, :mod:`..kernels.stream_write`; the reference and its written-out backward inside the operator elsewhere).
``--connection-kernels`` picks; both compute the same values and gradients."""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .dispatch import runs_fused, triton_kernels


def write_reference(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor) -> Tensor:
    """H' (..., n, C) from H (..., n, C), r (..., n, n) or (n, n), b (..., n) or (n), h and y (..., C), in the streams'
    dtype: b_j y + (sum_i r_ij H_i - b_j h), so that at r = I, b = 1 and streams that are copies of h, H'_j = y
    exactly."""
    mix, write = mix.to(streams.dtype), write.to(streams.dtype)
    mixed = torch.einsum("ij,...ic->...jc" if mix.dim() == 2 else "...ij,...ic->...jc", mix, streams)
    kept = mixed - write.unsqueeze(-1) * block_input.unsqueeze(-2)
    return write.unsqueeze(-1) * block_output.unsqueeze(-2) + kept


def readout_reference(streams: Tensor, readout: Tensor) -> Tensor:
    """The stack's state sum_j o_j H_j (..., C) in the streams' dtype, from the streams (..., n, C) and o (n)."""
    return (readout.to(streams.dtype).unsqueeze(-1) * streams).sum(-2)


def reference_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], streams: Tensor, mix: Tensor,
                       write: Tensor, block_input: Tensor, block_output: Tensor,
                       readout: Tensor) -> Tuple[Tensor, ...]:
    """The gradients of H (P, n, C), r (P, n, n), b (P, n), h, y (P, C) and o (n) from those of H' and the state
    (None: the output is not used), written out (autograd's values, without its graph)."""
    if grad is None:
        grad = torch.zeros_like(streams)
    if grad_state is None:
        grad_readout = torch.zeros_like(readout)
    else:
        out = write_reference(streams, mix, write, block_input, block_output)
        grad = grad + readout.to(grad.dtype)[:, None] * grad_state.unsqueeze(-2)  # dH'_j, the readout's share added
        grad_readout = torch.einsum("pc,pjc->j", grad_state.float(), out.float()).to(readout.dtype)
    grad_increment = (write.to(grad.dtype).unsqueeze(-1) * grad).sum(-2)
    return (torch.einsum("pij,pjc->pic", mix.to(grad.dtype), grad),
            torch.einsum("pic,pjc->pij", streams, grad).to(mix.dtype),
            (grad * (block_output - block_input).unsqueeze(-2)).sum(-1).to(write.dtype),
            -grad_increment, grad_increment, grad_readout)


@torch.library.custom_op("capsagg::stream_write", mutates_args=())
def _fused(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
           readout: Tensor) -> Tuple[Tensor, Tensor]:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.forward(streams, mix, write, block_input, block_output, readout)
    out = write_reference(streams, mix, write, block_input, block_output)
    return out, readout_reference(out, readout)


@_fused.register_fake
def _(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
      readout: Tensor) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(streams), torch.empty_like(block_input)


@torch.library.custom_op("capsagg::stream_write_backward", mutates_args=())
def _fused_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], streams: Tensor, mix: Tensor, write: Tensor,
                    block_input: Tensor, block_output: Tensor,
                    readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    kernels = triton_kernels(__name__, streams)
    if kernels is not None:
        return kernels.backward(grad, grad_state, streams, mix, write, block_input, block_output, readout)
    return reference_backward(grad, grad_state, streams, mix, write, block_input, block_output, readout)


@_fused_backward.register_fake
def _(grad: Optional[Tensor], grad_state: Optional[Tensor], streams: Tensor, mix: Tensor, write: Tensor,
      block_input: Tensor, block_output: Tensor,
      readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    return gradient_fakes(streams, mix, write, block_input, block_output, readout)


def gradient_fakes(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                   readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """What the write's gradients look like (its inputs' shapes, dtypes and strides), for the fakes of the operators
    that compute them."""
    return (torch.empty_like(streams), torch.empty_like(mix), torch.empty_like(write), torch.empty_like(block_input),
            torch.empty_like(block_output), torch.empty_like(readout))


def flat_inputs(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor,
                block_output: Tensor) -> List[Tensor]:
    """The write's tensors with every position on one axis, contiguous; static weights expanded to every position
    (their gradients summed back by the expansion's own backward)."""
    n, channels = streams.shape[-2:]
    positions = streams.numel() // (n * channels)
    return [t.reshape(positions, *t.shape[-k:]).contiguous() if t.dim() > k else
            t.expand(positions, *t.shape).contiguous()
            for t, k in ((streams, 2), (mix, 2), (write, 1), (block_input, 1), (block_output, 1))]


def _setup_context(ctx, inputs: Tuple[Tensor, ...], output: Tuple[Tensor, Tensor]) -> None:
    ctx.save_for_backward(*inputs)
    ctx.set_materialize_grads(False)  # below the top block the state is not read, above it the streams are not


def _backward(ctx, grad: Optional[Tensor], grad_state: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    return _fused_backward(None if grad is None else grad.contiguous(),
                           None if grad_state is None else grad_state.contiguous(), *ctx.saved_tensors)


_fused.register_autograd(_backward, setup_context=_setup_context)


def write_fused(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                readout: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`write_reference` and :func:`readout_reference` as one operator each way, on :func:`flat_inputs`."""
    out, state = _fused(*flat_inputs(streams, mix, write, block_input, block_output), readout.contiguous())
    return out.view(streams.shape), state.view(block_input.shape)


def stream_write(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                 readout: Tensor, kernel: str = "auto") -> Tuple[Tensor, Tensor]:
    """H' and the state sum_j o_j H'_j by the implementation ``kernel`` (:func:`.dispatch.runs_fused`; the same values)."""
    if runs_fused(kernel, streams):
        return write_fused(streams, mix, write, block_input, block_output, readout)
    out = write_reference(streams, mix, write, block_input, block_output)
    return out, readout_reference(out, readout)
