"""The residual streams' write and the stack's state after it in one Triton kernel each way (hyper-connections, mHC;
:mod:`.stream_write`).

Per position, with the n streams H (n x C), the mix r (n x n: stream i into stream j), the write b (n), the
block's input h and output y (C): H'_j = b_j y + (sum_i r_ij H_i - b_j h), in that order (the reference's: at
the identity start the streams stay exact copies), and the state sum_j o_j H'_j of the stored H', in fp32 whatever
the tensors' precision. Each program holds ``BLOCK_P`` positions and walks their C channels in chunks of
``BLOCK_C``; the backward recomputes H' for the readout's gradient and accumulates the per-position reductions over
C (the gradients of r and b) in registers across the chunks, so no position is split between programs, and writes
its share of the readout's gradient (summed afterwards). n is padded to the next power of two with zeros.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

BLOCK_P = 8
BLOCK_C = 64


@triton.jit
def _written(streams_ptr, input_ptr, output_ptr, mix, write, p, c, offsets, inside, pc_live, channels):
    """H' (P, N_j, BLOCK_C) of chunk c, fp32: b_j y + (sum_i r_ij H_i - b_j h), in the reference's order."""
    block_input = tl.load(input_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
    block_output = tl.load(output_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
    streams = tl.load(streams_ptr + offsets, mask=inside, other=0.0).to(tl.float32)  # (P, N_i, C)
    mixed = tl.sum(mix[:, :, :, None] * streams[:, :, None, :], axis=1)  # (P, N_j, C)
    kept = mixed - write[:, :, None] * block_input[:, None, :]
    return write[:, :, None] * block_output[:, None, :] + kept


@triton.jit
def _forward_kernel(streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, readout_ptr, out_ptr, state_ptr,
                    positions, n, channels, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    pi_live = live[:, None] & (i[None, :] < n)
    # r (P, N_i, N_j) and b (P, N_j), zero where padded
    mix = tl.load(mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :],
                  mask=pi_live[:, :, None] & (i[None, None, :] < n), other=0.0).to(tl.float32)
    write = tl.load(write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0).to(tl.float32)
    readout = tl.load(readout_ptr + i, mask=i < n, other=0.0).to(tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        pc_live = live[:, None] & (c[None, :] < channels)
        offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
        inside = pi_live[:, :, None] & (c[None, None, :] < channels)
        out = _written(streams_ptr, input_ptr, output_ptr, mix, write, p, c, offsets, inside, pc_live, channels)
        out = out.to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + offsets, out, mask=inside)
        state = tl.sum(readout[None, :, None] * out.to(tl.float32), axis=1)  # sum_j o_j H'_j of the rounded H'
        tl.store(state_ptr + p[:, None] * channels + c[None, :], state.to(state_ptr.dtype.element_ty), mask=pc_live)


@triton.jit
def _backward_kernel(grad_ptr, grad_state_ptr, streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, readout_ptr,
                     grad_streams_ptr, grad_mix_ptr, grad_write_ptr, grad_input_ptr, grad_output_ptr,
                     readout_shares_ptr, positions, n, channels, HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr,
                     N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    pi_live = live[:, None] & (i[None, :] < n)
    pij_live = pi_live[:, :, None] & (i[None, None, :] < n)
    mix_offsets = p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :]
    mix = tl.load(mix_ptr + mix_offsets, mask=pij_live, other=0.0).to(tl.float32)
    write = tl.load(write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0).to(tl.float32)
    readout = tl.load(readout_ptr + i, mask=i < n, other=0.0).to(tl.float32)
    grad_mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    grad_write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        pc_live = live[:, None] & (c[None, :] < channels)
        increment = (tl.load(output_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
                     - tl.load(input_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32))
        offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
        inside = pi_live[:, :, None] & (c[None, None, :] < channels)
        # dH'_j (P, N_j, C): its own gradient and the state's, o_j dS (either may be absent: an unused output)
        grad = tl.zeros((BLOCK_P, N, BLOCK_C), dtype=tl.float32)
        if HAS_GRAD:
            grad += tl.load(grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        if HAS_STATE:
            grad_state = tl.load(grad_state_ptr + p[:, None] * channels + c[None, :], mask=pc_live,
                                 other=0.0).to(tl.float32)
            grad += readout[None, :, None] * grad_state[:, None, :]
            written = _written(streams_ptr, input_ptr, output_ptr, mix, write, p, c, offsets, inside, pc_live,
                               channels)
            written = written.to(grad_streams_ptr.dtype.element_ty).to(tl.float32)  # H' as the forward stored it
            grad_readout += tl.sum(tl.sum(grad_state[:, None, :] * written, axis=2), axis=0)
        streams = tl.load(streams_ptr + offsets, mask=inside, other=0.0).to(tl.float32)  # H_i (P, N_i, C)
        # dH_i = sum_j r_ij dH'_j ; dr_ij = sum_c H_ic dH'_jc ; db_j = sum_c (y - h)_c dH'_jc ; d(y - h) = sum_j b_j dH'_j
        grad_streams = tl.sum(mix[:, :, :, None] * grad[:, None, :, :], axis=2)
        tl.store(grad_streams_ptr + offsets, grad_streams.to(grad_streams_ptr.dtype.element_ty), mask=inside)
        grad_mix += tl.sum(streams[:, :, None, :] * grad[:, None, :, :], axis=3)
        grad_write += tl.sum(grad * increment[:, None, :], axis=2)
        grad_increment = tl.sum(write[:, :, None] * grad, axis=1)
        tl.store(grad_output_ptr + p[:, None] * channels + c[None, :],
                 grad_increment.to(grad_output_ptr.dtype.element_ty), mask=pc_live)
        tl.store(grad_input_ptr + p[:, None] * channels + c[None, :],
                 (-grad_increment).to(grad_input_ptr.dtype.element_ty), mask=pc_live)
    tl.store(grad_mix_ptr + mix_offsets, grad_mix.to(grad_mix_ptr.dtype.element_ty), mask=pij_live)
    tl.store(grad_write_ptr + p[:, None] * n + i[None, :], grad_write.to(grad_write_ptr.dtype.element_ty),
             mask=pi_live)
    tl.store(readout_shares_ptr + program * n + i, grad_readout, mask=i < n)


def _grid(positions: int):
    return (triton.cdiv(positions, BLOCK_P),)


def forward(streams: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, block_input: torch.Tensor,
            block_output: torch.Tensor, readout: torch.Tensor):
    """H' (P, n, C) and the state sum_j o_j H'_j (P, C) from contiguous H (P, n, C), r (P, n, n), b (P, n), h and y
    (P, C) and o (n)."""
    positions, n, channels = streams.shape
    out = torch.empty_like(streams)
    state = torch.empty_like(block_input)
    _forward_kernel[_grid(positions)](streams, mix, write, block_input, block_output, readout, out, state, positions,
                                      n, channels, N=triton.next_power_of_2(n), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return out, state


def backward(grad: Optional[torch.Tensor], grad_state: Optional[torch.Tensor], streams: torch.Tensor, mix: torch.Tensor,
             write: torch.Tensor, block_input: torch.Tensor, block_output: torch.Tensor, readout: torch.Tensor):
    """The gradients of H, r, b, h, y and o given those of H' and the state (None: the output is not used)."""
    positions, n, channels = streams.shape
    grid = _grid(positions)
    grad_streams, grad_mix, grad_write = torch.empty_like(streams), torch.empty_like(mix), torch.empty_like(write)
    grad_input, grad_output = torch.empty_like(block_input), torch.empty_like(block_output)
    shares = torch.empty(grid[0], n, dtype=torch.float32, device=streams.device)
    _backward_kernel[grid](streams if grad is None else grad, block_input if grad_state is None else grad_state,
                           streams, mix, write, block_input, block_output, readout, grad_streams, grad_mix,
                           grad_write, grad_input, grad_output, shares, positions, n, channels,
                           HAS_GRAD=grad is not None, HAS_STATE=grad_state is not None, N=triton.next_power_of_2(n),
                           BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return grad_streams, grad_mix, grad_write, grad_input, grad_output, shares.sum(0).to(readout.dtype)
