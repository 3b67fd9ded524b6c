"""The residual streams' write in one Triton kernel each way (hyper-connections, mHC; :mod:`.stream_write`).

Per position, with the n streams H (n x C), the mix r (n x n: stream i into stream j), the write b (n), the
block's input h and output y (C): H'_j = b_j y + (sum_i r_ij H_i - b_j h), in that order (the reference's: at
the identity start the streams stay exact copies), in fp32 whatever the tensors' precision. Each program holds ``BLOCK_P`` positions
and walks their C channels in chunks of ``BLOCK_C``; the backward accumulates the per-position reductions over
C (the gradients of r and b) in registers across the chunks, so no position is split between programs. n is
padded to the next power of two with zeros.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

BLOCK_P = 8
BLOCK_C = 64


@triton.jit
def _forward_kernel(streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, out_ptr, positions, n, channels,
                    N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    pi_live = live[:, None] & (i[None, :] < n)
    # r (P, N_i, N_j) and b (P, N_j), zero where padded
    mix = tl.load(mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :],
                  mask=pi_live[:, :, None] & (i[None, None, :] < n), other=0.0).to(tl.float32)
    write = tl.load(write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0).to(tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        pc_live = live[:, None] & (c[None, :] < channels)
        block_input = tl.load(input_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
        block_output = tl.load(output_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
        offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
        inside = pi_live[:, :, None] & (c[None, None, :] < channels)
        streams = tl.load(streams_ptr + offsets, mask=inside, other=0.0).to(tl.float32)  # (P, N_i, C)
        mixed = tl.sum(mix[:, :, :, None] * streams[:, :, None, :], axis=1)  # (P, N_j, C)
        kept = mixed - write[:, :, None] * block_input[:, None, :]
        out = write[:, :, None] * block_output[:, None, :] + kept
        tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _backward_kernel(grad_ptr, streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr,
                     grad_streams_ptr, grad_mix_ptr, grad_write_ptr, grad_increment_ptr, positions, n, channels,
                     N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    pi_live = live[:, None] & (i[None, :] < n)
    pij_live = pi_live[:, :, None] & (i[None, None, :] < n)
    mix_offsets = p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :]
    mix = tl.load(mix_ptr + mix_offsets, mask=pij_live, other=0.0).to(tl.float32)
    write = tl.load(write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0).to(tl.float32)
    grad_mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    grad_write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        pc_live = live[:, None] & (c[None, :] < channels)
        increment = (tl.load(output_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
                     - tl.load(input_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32))
        offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
        inside = pi_live[:, :, None] & (c[None, None, :] < channels)
        grad = tl.load(grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)  # dH'_j (P, N_j, C)
        streams = tl.load(streams_ptr + offsets, mask=inside, other=0.0).to(tl.float32)  # H_i (P, N_i, C)
        # dH_i = sum_j r_ij dH'_j ; dr_ij = sum_c H_ic dH'_jc ; db_j = sum_c (y - h)_c dH'_jc ; d(y - h) = sum_j b_j dH'_j
        grad_streams = tl.sum(mix[:, :, :, None] * grad[:, None, :, :], axis=2)
        tl.store(grad_streams_ptr + offsets, grad_streams.to(grad_streams_ptr.dtype.element_ty), mask=inside)
        grad_mix += tl.sum(streams[:, :, None, :] * grad[:, None, :, :], axis=3)
        grad_write += tl.sum(grad * increment[:, None, :], axis=2)
        grad_increment = tl.sum(write[:, :, None] * grad, axis=1)
        tl.store(grad_increment_ptr + p[:, None] * channels + c[None, :],
                 grad_increment.to(grad_increment_ptr.dtype.element_ty), mask=pc_live)
    tl.store(grad_mix_ptr + mix_offsets, grad_mix.to(grad_mix_ptr.dtype.element_ty), mask=pij_live)
    tl.store(grad_write_ptr + p[:, None] * n + i[None, :], grad_write.to(grad_write_ptr.dtype.element_ty),
             mask=pi_live)


def _grid(positions: int):
    return (triton.cdiv(positions, BLOCK_P),)


def forward(streams: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, block_input: torch.Tensor,
            block_output: torch.Tensor) -> torch.Tensor:
    """H' (P, n, C) from contiguous fp32 H (P, n, C), r (P, n, n), b (P, n), h and y (P, C)."""
    positions, n, channels = streams.shape
    out = torch.empty_like(streams)
    _forward_kernel[_grid(positions)](streams, mix, write, block_input, block_output, out, positions, n, channels,
                                      N=triton.next_power_of_2(n), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return out


def backward(grad: torch.Tensor, streams: torch.Tensor, mix: torch.Tensor, write: torch.Tensor,
             block_input: torch.Tensor, block_output: torch.Tensor):
    """The gradients of H, r, b and of the increment y - h (that of y; h's is its negative)."""
    positions, n, channels = streams.shape
    grad_streams, grad_mix, grad_write = torch.empty_like(streams), torch.empty_like(mix), torch.empty_like(write)
    grad_increment = torch.empty_like(block_input)
    _backward_kernel[_grid(positions)](grad, streams, mix, write, block_input, block_output, grad_streams, grad_mix,
                                       grad_write, grad_increment, positions, n, channels,
                                       N=triton.next_power_of_2(n), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return grad_streams, grad_mix, grad_write, grad_increment
