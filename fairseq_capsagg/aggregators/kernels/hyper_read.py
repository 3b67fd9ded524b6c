"""A hyper-connection's read in one Triton kernel each way (:mod:`.hyper_read`).

Per position, with the n streams H (n x C): G = tanh(RMSNorm(H) W^T) (n x (n + 2)), a = A_m + s_a G[:, 0],
r = A_r + s_a G[:, 1:n+1], b = B + s_b G[:, n+1] and h = sum_i a_i H_i, in fp32 whatever the streams' precision.
Each program holds ``BLOCK_P`` positions and walks their C channels in chunks of ``BLOCK_C``: the forward reads
the streams twice (their RMS and projections, then the read), the backward three times (the gates and the
read's gradient, RMSNorm's mean, the streams' gradient). n and n + 2 are padded to powers of two with zeros. The
backward writes, per program, its share of the gradients of W, A_m, A_r, B, s_a and s_b (summed afterwards), so
that no two programs add into the same memory.

Between two blocks the same kernels also run the write of the block below first (``WRITES``,
:func:`forward_after_write`, :mod:`.write_read`): each pass computes the streams it reads, H', from the streams
before the write as :mod:`.stream_write` does (never reading back what the program stored), the forward's
first pass stores H' and the state, and the backward's last pass adds H''s gradient from above and the state's to
the read's in registers and runs the write's backward on the sum.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .common import position_kernel
from .stream_write import (block_write_weights, gathered_write_gradients, read_chunk, read_streams_gradient,
                           store_write_gradients, store_written, write_gradients, write_outputs)

BLOCK_P = 4
BLOCK_C = 64


@triton.jit
def tanh(x):
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def projection_chunk(w_ptr, k, c, outputs, channels):
    """W (K, BLOCK_C) of chunk c, zero where padded."""
    return tl.load(w_ptr + k[:, None] * channels + c[None, :], mask=(k[:, None] < outputs) & (c[None, :] < channels),
                   other=0.0).to(tl.float32)


@triton.jit
def column(gates, k, index):
    """gates[..., index] of (P, N, K)."""
    return tl.sum(tl.where(k[None, None, :] == index, gates, 0.0), axis=2)


@triton.jit
def read_weights(gates, p, i, k, live, n, read_ptr, mix_ptr, write_ptr, scale_a_ptr, scale_b_ptr, out_mix_ptr,
                 out_write_ptr):
    """From the gates G (P, N, K): stores r = A_r + s_a G[:, 1:n+1] (P, n, n) and b = B + s_b G[:, n+1] (P, n), fp32,
    and returns a = A_m + s_a G[:, 0] (P, N), fp32."""
    scale_a = tl.load(scale_a_ptr).to(tl.float32)
    scale_b = tl.load(scale_b_ptr).to(tl.float32)
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    read = tl.load(read_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + scale_a * column(gates, k, 0)
    write = tl.load(write_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] \
        + scale_b * column(gates, k, n + 1)
    tl.store(out_write_ptr + p[:, None] * n + i[None, :], write, mask=pi_live)
    # r_ij = A_r,ij + s_a G_i(1+j): G's columns 1..n gathered as (P, N_i, N_j)
    j_of_k = tl.where(k[None, None, None, :] == i[None, None, :, None] + 1, gates[:, :, None, :], 0.0)
    ij_live = i_live[:, None] & i_live[None, :]
    static_mix = tl.load(mix_ptr + i[:, None] * n + i[None, :], mask=ij_live, other=0.0).to(tl.float32)
    mix = static_mix[None, :, :] + scale_a * tl.sum(j_of_k, axis=3)
    tl.store(out_mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :], mix,
             mask=pi_live[:, :, None] & i_live[None, None, :])
    return read


@triton.jit
def gates_backward(gates, grad_a, program, p, i, k, live, n, grad_mix_ptr, grad_write_ptr, read_ptr, scale_a_ptr,
                   scale_b_ptr, read_shares_ptr, mix_shares_ptr, write_shares_ptr, scale_shares_ptr):
    """The gradient of the gates' pre-activation (P, N, K) from those of a (``grad_a``, P x N), r and b (loaded), and a
    (P, N) again, fp32; stores this program's shares of the gradients of A_m, A_r, B, s_a and s_b."""
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    scale_a = tl.load(scale_a_ptr).to(tl.float32)
    scale_b = tl.load(scale_b_ptr).to(tl.float32)
    read = tl.load(read_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + scale_a * column(gates, k, 0)
    # the gates' gradient, (P, N, K): column 0 from a, 1..n from r, n + 1 from b
    in_mix = (k[None, None, :] >= 1) & (k[None, None, :] <= n) & pi_live[:, :, None]
    grad_mix = tl.load(grad_mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + k[None, None, :] - 1,
                       mask=in_mix, other=0.0)
    grad_write = tl.load(grad_write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0)
    grad_gates = (scale_a * grad_mix + tl.where(k[None, None, :] == 0, scale_a * grad_a[:, :, None], 0.0)
                  + tl.where(k[None, None, :] == n + 1, scale_b * grad_write[:, :, None], 0.0))
    tl.store(read_shares_ptr + program * n + i, tl.sum(grad_a, axis=0), mask=i_live)
    tl.store(write_shares_ptr + program * n + i, tl.sum(grad_write, axis=0), mask=i_live)
    tl.store(mix_shares_ptr + program * n * n + i[:, None] * n + k[None, :] - 1, tl.sum(grad_mix, axis=0),
             mask=i_live[:, None] & (k[None, :] >= 1) & (k[None, :] <= n))
    grad_scale_a = tl.sum(tl.sum(column(gates, k, 0) * grad_a + tl.sum(gates * grad_mix, axis=2), axis=1), axis=0)
    grad_scale_b = tl.sum(tl.sum(column(gates, k, n + 1) * grad_write, axis=1), axis=0)
    tl.store(scale_shares_ptr + program * 2, grad_scale_a)
    tl.store(scale_shares_ptr + program * 2 + 1, grad_scale_b)
    return grad_gates * (1.0 - gates * gates), read


@position_kernel
def _forward_kernel(streams_ptr, w_ptr, read_ptr, mix_ptr, write_ptr, scale_a_ptr, scale_b_ptr, out_ptr,
                    out_mix_ptr, out_write_ptr, block_mix_ptr, block_write_ptr, input_ptr, output_ptr, readout_ptr,
                    written_ptr, state_ptr, positions, n, channels, eps, WRITES: tl.constexpr, N: tl.constexpr,
                    K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    dtype = out_ptr.dtype.element_ty
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    # pass 1: the streams' RMS and projections (and where the write comes first, H' and the state stored)
    total = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, N, K), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels, out_ptr,
                       WRITES)
        if WRITES:
            store_written(written_ptr, state_ptr, x, readout, p, i, c, live, n, channels)
        total += tl.sum(x * x, axis=2)
        w = projection_chunk(w_ptr, k, c, outputs, channels)
        acc += tl.sum(x[:, :, None, :] * w[None, None, :, :], axis=3)
    gates = tanh(acc / tl.sqrt(total / channels + eps)[:, :, None])
    read = read_weights(gates, p, i, k, live, n, read_ptr, mix_ptr, write_ptr, scale_a_ptr, scale_b_ptr, out_mix_ptr,
                        out_write_ptr)
    read = read.to(dtype).to(tl.float32)  # the reference weighs in the streams' dtype
    # pass 2: the read
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels, out_ptr,
                       WRITES)
        h = tl.sum(read[:, :, None] * x, axis=1)
        tl.store(out_ptr + p[:, None] * channels + c[None, :], h.to(dtype),
                 mask=live[:, None] & (c[None, :] < channels))


@position_kernel
def _backward_kernel(grad_h_ptr, grad_mix_ptr, grad_write_ptr, streams_ptr, w_ptr, read_ptr, scale_a_ptr,
                     scale_b_ptr, grad_streams_ptr, w_shares_ptr, read_shares_ptr, mix_shares_ptr, write_shares_ptr,
                     scale_shares_ptr, grad_ptr, grad_state_ptr, block_mix_ptr, block_write_ptr, input_ptr,
                     output_ptr, readout_ptr, grad_block_mix_ptr, grad_block_write_ptr, grad_input_ptr,
                     grad_output_ptr, readout_shares_ptr, positions, n, channels, eps, WRITES: tl.constexpr,
                     HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    # pass 1: the gates again, and the read's weights' gradient grad_a_i = grad_h . H_i
    total = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, N, K), dtype=tl.float32)
    grad_a = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        total += tl.sum(x * x, axis=2)
        w = projection_chunk(w_ptr, k, c, outputs, channels)
        acc += tl.sum(x[:, :, None, :] * w[None, None, :, :], axis=3)
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_a += tl.sum(grad_h[:, None, :] * x, axis=2)
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    gates = tanh(acc * inverse_rms[:, :, None])
    grad_pre, read = gates_backward(gates, grad_a, program, p, i, k, live, n, grad_mix_ptr, grad_write_ptr, read_ptr,
                                    scale_a_ptr, scale_b_ptr, read_shares_ptr, mix_shares_ptr, write_shares_ptr,
                                    scale_shares_ptr)
    # pass 2: RMSNorm's backward needs mean(g * normed) over each stream, g = grad_pre W
    projected = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        w = projection_chunk(w_ptr, k, c, outputs, channels)
        g = tl.sum(grad_pre[:, :, :, None] * w[None, None, :, :], axis=2)
        projected += tl.sum(g * x, axis=2)
    projected = projected * inverse_rms / channels
    # pass 3: the streams' gradient (RMSNorm's, plus the read's a_i grad_h) and this program's share of W's; where
    # the write comes first, H''s gradient from above and the state's added, and the write's backward run on the sum
    grad_block_mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    grad_block_write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        w = projection_chunk(w_ptr, k, c, outputs, channels)
        g = tl.sum(grad_pre[:, :, :, None] * w[None, None, :, :], axis=2)
        normed = x * inverse_rms[:, :, None]
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_x = inverse_rms[:, :, None] * (g - normed * projected[:, :, None]) + read[:, :, None] * grad_h[:, None, :]
        grad_w = tl.sum(tl.sum(grad_pre[:, :, :, None] * normed[:, :, None, :], axis=1), axis=0)  # (K, BLOCK_C)
        tl.store(w_shares_ptr + program * outputs * channels + k[:, None] * channels + c[None, :], grad_w,
                 mask=(k[:, None] < outputs) & (c[None, :] < channels))
        grad_block_mix, grad_block_write, grad_readout = read_streams_gradient(
            grad_x, x, grad_ptr, grad_state_ptr, streams_ptr, input_ptr, output_ptr, block_mix, block_write, readout,
            grad_streams_ptr, grad_input_ptr, grad_output_ptr, grad_block_mix, grad_block_write, grad_readout, p, i, c,
            live, n, channels, WRITES, HAS_GRAD, HAS_STATE)
    if WRITES:
        store_write_gradients(grad_block_mix_ptr, grad_block_write_ptr, readout_shares_ptr, grad_block_mix,
                              grad_block_write, grad_readout, program, p, i, live, n)


def _meta(positions: int, n: int):
    return (triton.cdiv(positions, BLOCK_P),), triton.next_power_of_2(n), triton.next_power_of_2(n + 2)


def _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps,
             written_by=None):
    positions, n, channels = streams.shape
    out = torch.empty(positions, channels, dtype=streams.dtype, device=streams.device)
    mix = torch.empty(positions, n, n, dtype=torch.float32, device=streams.device)
    write = torch.empty(positions, n, dtype=torch.float32, device=streams.device)
    writes = write_outputs(streams, written_by)
    grid, width, outputs = _meta(positions, n)
    _forward_kernel[grid](streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale,
                          out, mix, write, *writes, positions, n, channels, eps, WRITES=written_by is not None,
                          N=width, K=outputs, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return (out, mix, write) if written_by is None else (*writes[5:], out, mix, write)


def forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps):
    """h (P, C) in the streams' dtype, r (P, n, n) and b (P, n) fp32 from contiguous streams (P, n, C), W (n + 2, C),
    A_m (n), A_r (n, n), B (n) and the scalars s_a, s_b, each in any precision (read in fp32)."""
    return _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps)


def forward_after_write(streams, block_mix, block_write, block_input, block_output, readout, projection, static_read,
                        static_mix, static_write, read_mix_scale, write_scale, eps):
    """The block's write (:func:`.stream_write.forward`: H' and the state from H (P, n, C), its r (P, n, n),
    b (P, n), h and y (P, C) and o (n)), then the next block's read of H' (:func:`forward`), in one kernel: H', the
    state, h', r' and b'."""
    return _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps,
                    (block_mix, block_write, block_input, block_output, readout))


def _backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale, eps,
              written_by=None, grad=None, grad_state=None):
    positions, n, channels = streams.shape
    grid, width, outputs = _meta(positions, n)
    programs = grid[0]
    grad_streams = torch.empty_like(streams)
    shares = {name: torch.empty(programs, *shape, dtype=torch.float32, device=streams.device)
              for name, shape in (("w", (n + 2, channels)), ("read", (n,)), ("mix", (n, n)), ("write", (n,)),
                                  ("scales", (2,)))}
    writes = write_gradients(streams, written_by, grad, grad_state, programs)
    _backward_kernel[grid](grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale,
                           write_scale, grad_streams, shares["w"], shares["read"], shares["mix"], shares["write"],
                           shares["scales"], *writes, positions, n, channels, eps, WRITES=written_by is not None,
                           HAS_GRAD=grad is not None, HAS_STATE=grad_state is not None, N=width, K=outputs,
                           BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    static = static_read.dtype  # A_m's, A_r's and B's
    # each gradient its own sum: an operator's outputs never alias one another
    read_grads = (shares["w"].sum(0).to(projection.dtype), shares["read"].sum(0).to(static),
                  shares["mix"].sum(0).to(static), shares["write"].sum(0).to(static),
                  shares["scales"][:, 0].sum(0).to(read_mix_scale.dtype),
                  shares["scales"][:, 1].sum(0).to(write_scale.dtype))
    if written_by is None:
        return (grad_streams, *read_grads)
    return (grad_streams, *gathered_write_gradients(writes), *read_grads)


def backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale, eps):
    """The gradients of the streams, W, A_m, A_r, B, s_a and s_b given those of the forward's outputs, each in its
    input's precision."""
    return _backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale,
                     eps)


def backward_after_write(grad, grad_state, grad_read, grad_mix, grad_write, streams, block_mix, block_write,
                         block_input, block_output, readout, projection, static_read, read_mix_scale, write_scale,
                         eps):
    """:func:`forward_after_write`'s backward: the gradients of H, r, b, h, y, o, W, A_m, A_r, B, s_a and s_b given
    those of H' and the state (None: not used) and of h', r' and b'; H''s complete gradient (from above, the state's
    and the read's) is summed in registers and never stored."""
    return _backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale,
                     eps, (block_mix, block_write, block_input, block_output, readout), grad, grad_state)
