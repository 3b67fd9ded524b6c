"""A hyper-connection's read in one Triton kernel each way (:mod:`.hyper_read`).

Per position, with the n streams H (n x C): G = tanh(RMSNorm(H) W^T) (n x (n + 2)), a = A_m + s_a G[:, 0],
r = A_r + s_a G[:, 1:n+1], b = B + s_b G[:, n+1] and h = sum_i a_i H_i, in fp32 whatever the streams' precision.
Each program holds ``BLOCK_P`` positions and walks their C channels in chunks of ``BLOCK_C``: the forward reads
the streams twice (their RMS and projections, then the read), the backward three times (the gates and the
read's gradient, RMSNorm's mean, the streams' gradient). n and n + 2 are padded to powers of two with zeros. The
backward writes, per program, its share of the gradients of W, A_m, A_r, B, s_a and s_b (summed afterwards), so
that no two programs add into the same memory.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .tiles_triton import stream_chunk

BLOCK_P = 4
BLOCK_C = 64


@triton.jit
def _tanh(x):
    return 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0


@triton.jit
def _projection(w_ptr, k, c, outputs, channels):
    """W (K, BLOCK_C) of chunk c, zero where padded."""
    return tl.load(w_ptr + k[:, None] * channels + c[None, :], mask=(k[:, None] < outputs) & (c[None, :] < channels),
                   other=0.0).to(tl.float32)


@triton.jit
def _column(gates, k, index):
    """gates[..., index] of (P, N, K)."""
    return tl.sum(tl.where(k[None, None, :] == index, gates, 0.0), axis=2)


@triton.jit
def _forward_kernel(streams_ptr, w_ptr, read_ptr, mix_ptr, write_ptr, scale_a_ptr, scale_b_ptr, out_ptr,
                    out_mix_ptr, out_write_ptr, positions, n, channels, eps, N: tl.constexpr, K: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    total = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, N, K), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        total += tl.sum(x * x, axis=2)
        w = _projection(w_ptr, k, c, outputs, channels)
        acc += tl.sum(x[:, :, None, :] * w[None, None, :, :], axis=3)
    gates = _tanh(acc / tl.sqrt(total / channels + eps)[:, :, None])
    scale_a = tl.load(scale_a_ptr).to(tl.float32)
    scale_b = tl.load(scale_b_ptr).to(tl.float32)
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    read = tl.load(read_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + scale_a * _column(gates, k, 0)
    write = tl.load(write_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] \
        + scale_b * _column(gates, k, n + 1)
    tl.store(out_write_ptr + p[:, None] * n + i[None, :], write, mask=pi_live)
    # r_ij = A_r,ij + s_a G_i(1+j): G's columns 1..n gathered as (P, N_i, N_j)
    j_of_k = tl.where(k[None, None, None, :] == i[None, None, :, None] + 1, gates[:, :, None, :], 0.0)
    ij_live = i_live[:, None] & i_live[None, :]
    static_mix = tl.load(mix_ptr + i[:, None] * n + i[None, :], mask=ij_live, other=0.0).to(tl.float32)
    mix = static_mix[None, :, :] + scale_a * tl.sum(j_of_k, axis=3)
    tl.store(out_mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :], mix,
             mask=pi_live[:, :, None] & i_live[None, None, :])
    read = read.to(out_ptr.dtype.element_ty).to(tl.float32)  # the reference weighs in the streams' dtype
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        h = tl.sum(read[:, :, None] * x, axis=1)
        tl.store(out_ptr + p[:, None] * channels + c[None, :], h.to(out_ptr.dtype.element_ty),
                 mask=live[:, None] & (c[None, :] < channels))


@triton.jit
def _backward_kernel(grad_h_ptr, grad_mix_ptr, grad_write_ptr, streams_ptr, w_ptr, read_ptr, scale_a_ptr,
                     scale_b_ptr, grad_streams_ptr, w_shares_ptr, read_shares_ptr, mix_shares_ptr, write_shares_ptr,
                     scale_shares_ptr, positions, n, channels, eps, N: tl.constexpr, K: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    # pass 1: the gates again, and the read's weights' gradient grad_a_i = grad_h . H_i
    total = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, N, K), dtype=tl.float32)
    grad_a = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        total += tl.sum(x * x, axis=2)
        w = _projection(w_ptr, k, c, outputs, channels)
        acc += tl.sum(x[:, :, None, :] * w[None, None, :, :], axis=3)
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_a += tl.sum(grad_h[:, None, :] * x, axis=2)
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    gates = _tanh(acc * inverse_rms[:, :, None])
    scale_a = tl.load(scale_a_ptr).to(tl.float32)
    scale_b = tl.load(scale_b_ptr).to(tl.float32)
    read = tl.load(read_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + scale_a * _column(gates, k, 0)
    # the gates' gradient, (P, N, K): column 0 from a, 1..n from r, n + 1 from b
    in_mix = (k[None, None, :] >= 1) & (k[None, None, :] <= n) & pi_live[:, :, None]
    grad_mix = tl.load(grad_mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + k[None, None, :] - 1,
                       mask=in_mix, other=0.0)
    grad_write = tl.load(grad_write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0)
    grad_gates = (scale_a * grad_mix + tl.where(k[None, None, :] == 0, scale_a * grad_a[:, :, None], 0.0)
                  + tl.where(k[None, None, :] == n + 1, scale_b * grad_write[:, :, None], 0.0))
    grad_pre = grad_gates * (1.0 - gates * gates)
    # this program's shares of the static weights' and the scales' gradients
    tl.store(read_shares_ptr + program * n + i, tl.sum(grad_a, axis=0), mask=i_live)
    tl.store(write_shares_ptr + program * n + i, tl.sum(grad_write, axis=0), mask=i_live)
    tl.store(mix_shares_ptr + program * n * n + i[:, None] * n + k[None, :] - 1, tl.sum(grad_mix, axis=0),
             mask=i_live[:, None] & (k[None, :] >= 1) & (k[None, :] <= n))
    grad_scale_a = tl.sum(tl.sum(_column(gates, k, 0) * grad_a + tl.sum(gates * grad_mix, axis=2), axis=1), axis=0)
    grad_scale_b = tl.sum(tl.sum(_column(gates, k, n + 1) * grad_write, axis=1), axis=0)
    tl.store(scale_shares_ptr + program * 2, grad_scale_a)
    tl.store(scale_shares_ptr + program * 2 + 1, grad_scale_b)
    # pass 2: RMSNorm's backward needs mean(g * normed) over each stream, g = grad_pre W
    projected = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        w = _projection(w_ptr, k, c, outputs, channels)
        g = tl.sum(grad_pre[:, :, :, None] * w[None, None, :, :], axis=2)
        projected += tl.sum(g * x, axis=2)
    projected = projected * inverse_rms / channels
    # pass 3: the streams' gradient (RMSNorm's, plus the read's a_i grad_h) and this program's share of W's
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        w = _projection(w_ptr, k, c, outputs, channels)
        g = tl.sum(grad_pre[:, :, :, None] * w[None, None, :, :], axis=2)
        normed = x * inverse_rms[:, :, None]
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_x = inverse_rms[:, :, None] * (g - normed * projected[:, :, None]) + read[:, :, None] * grad_h[:, None, :]
        inside = pi_live[:, :, None] & (c[None, None, :] < channels)
        tl.store(grad_streams_ptr + p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :],
                 grad_x.to(grad_streams_ptr.dtype.element_ty), mask=inside)
        grad_w = tl.sum(tl.sum(grad_pre[:, :, :, None] * normed[:, :, None, :], axis=1), axis=0)  # (K, BLOCK_C)
        tl.store(w_shares_ptr + program * outputs * channels + k[:, None] * channels + c[None, :], grad_w,
                 mask=(k[:, None] < outputs) & (c[None, :] < channels))


def _meta(positions: int, n: int):
    return (triton.cdiv(positions, BLOCK_P),), triton.next_power_of_2(n), triton.next_power_of_2(n + 2)


def forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps):
    """h (P, C) in the streams' dtype, r (P, n, n) and b (P, n) fp32 from contiguous streams (P, n, C), W (n + 2, C),
    A_m (n), A_r (n, n), B (n) and the scalars s_a, s_b, each in any precision (read in fp32)."""
    positions, n, channels = streams.shape
    out = torch.empty(positions, channels, dtype=streams.dtype, device=streams.device)
    mix = torch.empty(positions, n, n, dtype=torch.float32, device=streams.device)
    write = torch.empty(positions, n, dtype=torch.float32, device=streams.device)
    grid, width, outputs = _meta(positions, n)
    _forward_kernel[grid](streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale,
                          out, mix, write, positions, n, channels, eps, N=width, K=outputs, BLOCK_P=BLOCK_P,
                          BLOCK_C=BLOCK_C)
    return out, mix, write


def backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale, eps):
    """The gradients of the streams, W, A_m, A_r, B, s_a and s_b given those of the forward's outputs, each in its
    input's precision."""
    positions, n, channels = streams.shape
    grid, width, outputs = _meta(positions, n)
    programs = grid[0]
    grad_streams = torch.empty_like(streams)
    shares = {name: torch.empty(programs, *shape, dtype=torch.float32, device=streams.device)
              for name, shape in (("w", (n + 2, channels)), ("read", (n,)), ("mix", (n, n)), ("write", (n,)),
                                  ("scales", (2,)))}
    _backward_kernel[grid](grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale,
                           write_scale, grad_streams, shares["w"], shares["read"], shares["mix"], shares["write"],
                           shares["scales"], positions, n, channels, eps, N=width, K=outputs, BLOCK_P=BLOCK_P,
                           BLOCK_C=BLOCK_C)
    scales = shares["scales"].sum(0)
    static = static_read.dtype  # A_m's, A_r's and B's
    return (grad_streams, shares["w"].sum(0).to(projection.dtype), shares["read"].sum(0).to(static),
            shares["mix"].sum(0).to(static), shares["write"].sum(0).to(static), scales[0].to(read_mix_scale.dtype),
            scales[1].to(write_scale.dtype))
