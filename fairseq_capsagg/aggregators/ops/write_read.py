"""A block's write into the residual streams and the next block's read of them as one operator each way:
``capsagg::hyper_write_read`` (hyper-connections: :mod:`.stream_write`, then :mod:`.hyper_read`) and
``capsagg::mhc_write_read`` (mHC: :mod:`.stream_write`, then :mod:`.mhc_read`). On CUDA one Triton kernel each way,
the read's kernel computing the streams it reads as the write's kernel does (:mod:`..kernels.hyper_read`,
:mod:`..kernels.mhc_read`); elsewhere the two references and their written-out backwards inside the operator. The
same values and gradients as the two operators one after the other.

Between two blocks the streams H' that block l writes are what block l + 1 reads, so its write and the next read
meet in one operator: H' then has one consumer, its gradient is complete as the backward computes it (no gradient
of the read added to the write's by another kernel), and it is not read back to be read from. A model calls these
where ``--connection-kernels`` runs the fused operators (:meth:`.StreamConnection.write_and_read`).
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from ..numerics import RMS_EPS
from . import hyper_read, mhc_read, stream_write
from .dispatch import triton_kernels

#: The outputs: H', the state, and the next block's input and the two weights its read computes.
OUTPUTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]
#: The fused operators' outputs: :data:`OUTPUTS`, then what their backward reads, D and 1/RMS of the next read.
SAVED_OUTPUTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]
#: The gradients of H, r, b, h, y, o and then of the read's six weights.
GRADIENTS = Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]


def _written_fakes(streams: Tensor, block_input: Tensor, mix_shape: Tuple[int, ...]) -> OUTPUTS:
    """The outputs' fakes, the next read's mixing weights (or their logits) ``mix_shape`` per position."""
    positions, n, _ = streams.shape
    return (torch.empty_like(streams), torch.empty_like(block_input), torch.empty_like(block_input),
            streams.new_empty(positions, *mix_shape, dtype=torch.float32),
            streams.new_empty(positions, n, dtype=torch.float32))


def _gradients_from_above(ctx, grads: Tuple[Optional[Tensor], ...],
                          mix_shape: Tuple[int, ...]) -> List[Optional[Tensor]]:
    """H''s and the state's gradients as autograd gives them (None: not read), then those of the next block's input
    and read weights (its mixing weights ``mix_shape`` per position), which the next block always reads (zero where
    autograd left one out), contiguous."""
    grad, grad_state, *next_grads = grads
    streams, block_input = ctx.saved_tensors[0], ctx.saved_tensors[3]
    positions, n, _ = streams.shape
    shapes = [(block_input.shape, block_input.dtype), ((positions, *mix_shape), torch.float32),
              ((positions, n), torch.float32)]
    return [None if grad is None else grad.contiguous(), None if grad_state is None else grad_state.contiguous(),
            *(streams.new_zeros(shape, dtype=dtype) if g is None else g.to(dtype).contiguous()
              for g, (shape, dtype) in zip(next_grads, shapes))]


def _unflat(outputs: OUTPUTS, streams: Tensor, block_input: Tensor) -> OUTPUTS:
    out, state, next_input, next_mix, next_write = outputs
    batch, n = streams.shape[:-2], streams.size(-2)
    return (out.view(streams.shape), state.view(block_input.shape), next_input.view(block_input.shape),
            next_mix.view(*batch, *next_mix.shape[1:]), next_write.view(*batch, n))


# hyper-connections


def hyper_reference(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                    readout: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor,
                    static_write: Tensor, read_mix_scale: Tensor, write_scale: Tensor) -> OUTPUTS:
    """H' and the state sum_j o_j H'_j (:func:`.stream_write.write_reference`), then the next hyper-connection's h', r'
    and b' from H' (:func:`.hyper_read.read_reference`)."""
    out = stream_write.write_reference(streams, mix, write, block_input, block_output)
    return (out, stream_write.readout_reference(out, readout),
            *hyper_read.read_reference(out, projection, static_read, static_mix, static_write, read_mix_scale,
                                       write_scale))


def hyper_reference_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor,
                             grad_next_mix: Tensor, grad_next_write: Tensor, streams: Tensor, mix: Tensor,
                             write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor,
                             projection: Tensor, static_read: Tensor, read_mix_scale: Tensor,
                             write_scale: Tensor) -> GRADIENTS:
    """The gradients of :func:`hyper_reference`'s inputs for positions (P, n, C): the read's backward on H', its
    gradient of H' added to the one from above, the write's backward on the sum (autograd's values, without its
    graph)."""
    out = stream_write.write_reference(streams, mix, write, block_input, block_output)
    grad_out, *read_grads = hyper_read.reference_backward(grad_next_input, grad_next_mix, grad_next_write, out,
                                                          projection, static_read, read_mix_scale, write_scale)
    grad_out = grad_out if grad is None else grad_out + grad
    return (*stream_write.reference_backward(grad_out, grad_state, streams, mix, write, block_input, block_output,
                                             readout), *read_grads)


@torch.library.custom_op("capsagg::hyper_write_read", mutates_args=())
def _hyper(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor,
           projection: Tensor, static_read: Tensor, static_mix: Tensor, static_write: Tensor, read_mix_scale: Tensor,
           write_scale: Tensor) -> SAVED_OUTPUTS:
    kernels = triton_kernels(hyper_read.__name__, streams)
    if kernels is not None:
        return kernels.forward_after_write(streams, mix, write, block_input, block_output, readout, projection,
                                           static_read, static_mix, static_write, read_mix_scale, write_scale, RMS_EPS)
    outputs = hyper_reference(streams, mix, write, block_input, block_output, readout, projection, static_read,
                              static_mix, static_write, read_mix_scale, write_scale)
    return (*outputs, *hyper_read.saved_sums(outputs[0], projection))


@_hyper.register_fake
def _(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor,
      projection: Tensor, static_read: Tensor, static_mix: Tensor, static_write: Tensor, read_mix_scale: Tensor,
      write_scale: Tensor) -> SAVED_OUTPUTS:
    n = streams.size(1)
    return (*_written_fakes(streams, block_input, (n, n)), *hyper_read.saved_fakes(streams))


@torch.library.custom_op("capsagg::hyper_write_read_backward", mutates_args=())
def _hyper_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor,
                    grad_next_mix: Tensor, grad_next_write: Tensor, streams: Tensor, mix: Tensor, write: Tensor,
                    block_input: Tensor, block_output: Tensor, readout: Tensor, projection: Tensor,
                    static_read: Tensor, read_mix_scale: Tensor, write_scale: Tensor, written: Tensor,
                    dynamic: Tensor, inverse_rms: Tensor) -> GRADIENTS:
    kernels = triton_kernels(hyper_read.__name__, streams)
    if kernels is not None:
        return kernels.backward_after_write(grad, grad_state, grad_next_input, grad_next_mix, grad_next_write,
                                            streams, written, mix, write, block_input, block_output, readout,
                                            projection, static_read, read_mix_scale, write_scale, dynamic,
                                            inverse_rms)
    return hyper_reference_backward(grad, grad_state, grad_next_input, grad_next_mix, grad_next_write, streams, mix,
                                    write, block_input, block_output, readout, projection, static_read,
                                    read_mix_scale, write_scale)


@_hyper_backward.register_fake
def _(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor, grad_next_mix: Tensor,
      grad_next_write: Tensor, streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
      readout: Tensor, projection: Tensor, static_read: Tensor, read_mix_scale: Tensor, write_scale: Tensor,
      written: Tensor, dynamic: Tensor, inverse_rms: Tensor) -> GRADIENTS:
    n = streams.size(1)
    scalar = read_mix_scale.new_empty(())
    return (*stream_write.gradient_fakes(streams, mix, write, block_input, block_output, readout),
            torch.empty_like(projection), static_read.new_empty(n), static_read.new_empty(n, n),
            static_read.new_empty(n), scalar, scalar.clone())


def _hyper_setup_context(ctx, inputs: Tuple[Tensor, ...], output: SAVED_OUTPUTS) -> None:
    *written, projection, static_read, _, _, read_mix_scale, write_scale = inputs
    ctx.mark_non_differentiable(*output[5:])
    # H' as stored (the next read's streams) and the read's D and 1/RMS: its backward reads them instead of
    # recomputing them
    ctx.save_for_backward(*written, projection, static_read, read_mix_scale, write_scale, output[0], *output[5:])
    ctx.set_materialize_grads(False)  # H' is read by the next write; the state only after the top block


def _hyper_autograd_backward(ctx, *grads: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    n = ctx.saved_tensors[0].size(1)
    return _hyper_backward(*_gradients_from_above(ctx, grads[:5], (n, n)), *ctx.saved_tensors)


_hyper.register_autograd(_hyper_autograd_backward, setup_context=_hyper_setup_context)


def hyper_write_read(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                     readout: Tensor, projection: Tensor, static_read: Tensor, static_mix: Tensor,
                     static_write: Tensor, read_mix_scale: Tensor, write_scale: Tensor) -> OUTPUTS:
    """:func:`hyper_reference` as one operator each way, for streams (..., n, C) and a write's r (..., n, n) and
    b (..., n) at every position: H', the state, h' (..., C), r' (..., n, n) and b' (..., n)."""
    outputs = _hyper(*stream_write.flat_inputs(streams, mix, write, block_input, block_output),
                     readout.contiguous(), projection.contiguous(), static_read, static_mix.contiguous(), static_write,
                     read_mix_scale, write_scale)
    return _unflat(outputs[:5], streams, block_input)


# mHC


def mhc_reference(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                  readout: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor,
                  alpha: Tensor, gate: Tensor, home: int, shared_gate: bool) -> OUTPUTS:
    """H' and the state sum_j o_j H'_j (:func:`.stream_write.write_reference`), then the next mHC's h', H_res's logits
    and H_post from H' (:func:`.mhc_read.read_reference`)."""
    out = stream_write.write_reference(streams, mix, write, block_input, block_output)
    return (out, stream_write.readout_reference(out, readout),
            *mhc_read.read_reference(out, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate))


def mhc_reference_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor,
                           grad_next_res: Tensor, grad_next_write: Tensor, streams: Tensor, mix: Tensor,
                           write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor, phi: Tensor,
                           pre_logits: Tensor, post_logits: Tensor, alpha: Tensor, gate: Tensor, home: int,
                           shared_gate: bool) -> GRADIENTS:
    """The gradients of :func:`mhc_reference`'s inputs for positions (P, n, C), as
    :func:`hyper_reference_backward`'s."""
    out = stream_write.write_reference(streams, mix, write, block_input, block_output)
    grad_out, *read_grads = mhc_read.reference_backward(grad_next_input, grad_next_res, grad_next_write, out, phi,
                                                        pre_logits, post_logits, alpha, gate, home, shared_gate)
    grad_out = grad_out if grad is None else grad_out + grad
    return (*stream_write.reference_backward(grad_out, grad_state, streams, mix, write, block_input, block_output,
                                             readout), *read_grads)


@torch.library.custom_op("capsagg::mhc_write_read", mutates_args=())
def _mhc(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor,
         phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor, alpha: Tensor, gate: Tensor,
         home: int, shared_gate: bool) -> SAVED_OUTPUTS:
    kernels = triton_kernels(mhc_read.__name__, streams)
    if kernels is not None:
        return kernels.forward_after_write(streams, mix, write, block_input, block_output, readout, phi, pre_logits,
                                           post_logits, res_logits, alpha, gate, home, shared_gate, RMS_EPS)
    outputs = mhc_reference(streams, mix, write, block_input, block_output, readout, phi, pre_logits, post_logits,
                            res_logits, alpha, gate, home, shared_gate)
    return (*outputs, *mhc_read.saved_sums(outputs[0], phi))


@_mhc.register_fake
def _(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor, readout: Tensor,
      phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor, alpha: Tensor, gate: Tensor,
      home: int, shared_gate: bool) -> SAVED_OUTPUTS:
    return (*_written_fakes(streams, block_input, tuple(res_logits.shape)),
            *mhc_read.saved_fakes(streams, res_logits.numel()))


@torch.library.custom_op("capsagg::mhc_write_read_backward", mutates_args=())
def _mhc_backward(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor, grad_next_res: Tensor,
                  grad_next_write: Tensor, streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor,
                  block_output: Tensor, readout: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor,
                  alpha: Tensor, gate: Tensor, written: Tensor, dynamic: Tensor, inverse_rms: Tensor, home: int,
                  shared_gate: bool) -> GRADIENTS:
    kernels = triton_kernels(mhc_read.__name__, streams)
    if kernels is not None:
        return kernels.backward_after_write(grad, grad_state, grad_next_input, grad_next_res, grad_next_write,
                                            streams, written, mix, write, block_input, block_output, readout, phi,
                                            pre_logits, post_logits, alpha, gate, dynamic, inverse_rms, home,
                                            shared_gate)
    return mhc_reference_backward(grad, grad_state, grad_next_input, grad_next_res, grad_next_write, streams, mix,
                                  write, block_input, block_output, readout, phi, pre_logits, post_logits, alpha,
                                  gate, home, shared_gate)


@_mhc_backward.register_fake
def _(grad: Optional[Tensor], grad_state: Optional[Tensor], grad_next_input: Tensor, grad_next_res: Tensor,
      grad_next_write: Tensor, streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
      readout: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, alpha: Tensor, gate: Tensor,
      written: Tensor, dynamic: Tensor, inverse_rms: Tensor, home: int, shared_gate: bool) -> GRADIENTS:
    return (*stream_write.gradient_fakes(streams, mix, write, block_input, block_output, readout),
            torch.empty_like(phi), torch.empty_like(pre_logits), torch.empty_like(post_logits),
            pre_logits.new_empty(grad_next_res.shape[1:]), torch.empty_like(alpha), torch.empty_like(gate))


def _mhc_setup_context(ctx, inputs: Tuple, output: SAVED_OUTPUTS) -> None:
    *written, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate = inputs
    ctx.res_shape = tuple(res_logits.shape)
    ctx.mark_non_differentiable(*output[5:])
    # H' as stored (the next read's streams) and the read's D and 1/RMS: its backward reads them instead of
    # recomputing them
    ctx.save_for_backward(*written, phi, pre_logits, post_logits, alpha, gate, output[0], *output[5:])
    ctx.home = home
    ctx.shared_gate = shared_gate
    ctx.set_materialize_grads(False)  # H' is read by the next write; the state only after the top block


def _mhc_autograd_backward(ctx, *grads: Optional[Tensor]) -> Tuple[Optional[Tensor], ...]:
    return (*_mhc_backward(*_gradients_from_above(ctx, grads[:5], ctx.res_shape), *ctx.saved_tensors, ctx.home,
                           ctx.shared_gate),
            None, None)


_mhc.register_autograd(_mhc_autograd_backward, setup_context=_mhc_setup_context)


def mhc_write_read(streams: Tensor, mix: Tensor, write: Tensor, block_input: Tensor, block_output: Tensor,
                   readout: Tensor, phi: Tensor, pre_logits: Tensor, post_logits: Tensor, res_logits: Tensor,
                   alpha: Tensor, gate: Tensor, home: int, shared_gate: bool) -> OUTPUTS:
    """:func:`mhc_reference` as one operator each way, for streams (..., n, C) and a write's r (..., n, n) and
    b (..., n) at every position: H', the state, h' (..., C), H_res's logits (..., n, n) and H_post (..., n)."""
    outputs = _mhc(*stream_write.flat_inputs(streams, mix, write, block_input, block_output), readout.contiguous(),
                   phi.contiguous(), pre_logits, post_logits, res_logits.contiguous(), alpha, gate, home, shared_gate)
    return _unflat(outputs[:5], streams, block_input)
