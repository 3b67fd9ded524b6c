"""mHC's read in one Triton kernel each way (:mod:`.mhc_read`).

Per position, with the n streams H (n x C) read as one row of n C: D = RMSNorm(H) phi^T (2n + n^2), the logits
pre, post and res, H_pre = e_home + g (sigmoid(pre) - e_home), H_post = 2 sigmoid(post) (with ``SHARED``, a
checkpoint of the start before: 1 + g (2 sigmoid(post) - 1)) and h = sum_i H_pre,i H_i, in fp32 whatever the streams' precision. Each program holds ``BLOCK_P`` positions and walks
their C channels in chunks of ``BLOCK_C``, every stream at once: the forward reads the streams twice (their RMS
and projections, then the read), the backward four times (the logits, the read's gradient, RMSNorm's mean,
the streams' gradient). n and 2n + n^2 are padded to powers of two with zeros. The backward writes, per program,
its share of the gradients of phi, the static logits, alpha and the gate (summed afterwards), so that no two
programs add into the same memory. Between two blocks the same kernels also run the write of the block below first
(``WRITES``, :func:`forward_after_write`), as :mod:`.hyper_read`'s do.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .common import position_kernel
from .stream_write import (block_write_weights, gathered_write_gradients, read_chunk, read_streams_gradient,
                           store_write_gradients, store_written, write_gradients, write_outputs)

BLOCK_P = 4
BLOCK_C = 16


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _phi(phi_ptr, i, k, c, n, outputs, channels):
    """phi (N, K, BLOCK_C) of chunk c: column i C + c of row k, zero where padded."""
    inside = (i[:, None, None] < n) & (k[None, :, None] < outputs) & (c[None, None, :] < channels)
    return tl.load(phi_ptr + k[None, :, None] * n * channels + i[:, None, None] * channels + c[None, None, :],
                   mask=inside, other=0.0).to(tl.float32)


@triton.jit
def _logits(streams_ptr, phi_ptr, block_mix, block_write, input_ptr, output_ptr, readout, written_ptr, state_ptr, p, i,
            k, live, n, channels, eps, like_ptr, WRITES: tl.constexpr, STORES: tl.constexpr,
            BLOCK_P: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_C: tl.constexpr):
    """1 / RMS of each position's n C row (P) and D = RMSNorm(row) phi^T (P, K); the streams read as
    :func:`.stream_write.read_chunk` reads them, and with ``STORES`` the H' and state it computed stored."""
    outputs = 2 * n + n * n
    total = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, K), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels, like_ptr,
                       WRITES)
        if STORES:
            store_written(written_ptr, state_ptr, x, readout, p, i, c, live, n, channels)
        total += tl.sum(tl.sum(x * x, axis=2), axis=1)
        w = _phi(phi_ptr, i, k, c, n, outputs, channels)
        acc += tl.sum(tl.sum(x[:, :, None, :] * w[None, :, :, :], axis=3), axis=1)
    inverse_rms = 1.0 / tl.sqrt(total / (n * channels) + eps)
    return inverse_rms, acc * inverse_rms[:, None]


@triton.jit
def _pick(dynamic, i, k, offset):
    """dynamic[:, offset + i] as (P, N) from (P, K)."""
    return tl.sum(tl.where(k[None, None, :] == offset + i[None, :, None], dynamic[:, None, :], 0.0), axis=2)


@position_kernel
def _forward_kernel(streams_ptr, phi_ptr, pre_ptr, post_ptr, res_ptr, alpha_ptr, gate_ptr, out_ptr, out_res_ptr,
                    out_write_ptr, block_mix_ptr, block_write_ptr, input_ptr, output_ptr, readout_ptr, written_ptr,
                    state_ptr, positions, n, channels, home, eps, WRITES: tl.constexpr, SHARED: tl.constexpr,
                    N: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    dtype = out_ptr.dtype.element_ty
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    _, dynamic = _logits(streams_ptr, phi_ptr, block_mix, block_write, input_ptr, output_ptr, readout, written_ptr,
                         state_ptr, p, i, k, live, n, channels, eps, out_ptr, WRITES, WRITES, BLOCK_P, N, K, BLOCK_C)
    alpha_pre = tl.load(alpha_ptr).to(tl.float32)
    alpha_post = tl.load(alpha_ptr + 1).to(tl.float32)
    alpha_res = tl.load(alpha_ptr + 2).to(tl.float32)
    g = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
    pre = tl.load(pre_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + alpha_pre * _pick(dynamic, i, k, 0)
    post = tl.load(post_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :] + alpha_post * _pick(dynamic, i, k, n)
    read = g * _sigmoid(pre) + tl.where(i[None, :] == home, 1.0 - g, 0.0)
    if SHARED:
        write = 1.0 + g * (2.0 * _sigmoid(post) - 1.0)
    else:
        write = 2.0 * _sigmoid(post)
    tl.store(out_write_ptr + p[:, None] * n + i[None, :], write, mask=pi_live)
    # res_ij = b_res,ij + alpha_2 D[2n + i n + j], gathered as (P, N_i, N_j)
    ij = 2 * n + i[:, None] * n + i[None, :]
    res = tl.sum(tl.where(k[None, None, None, :] == ij[None, :, :, None], dynamic[:, None, None, :], 0.0), axis=3)
    ij_live = i_live[:, None] & i_live[None, :]
    static_res = tl.load(res_ptr + i[:, None] * n + i[None, :], mask=ij_live, other=0.0).to(tl.float32)
    res = static_res[None, :, :] + alpha_res * res
    tl.store(out_res_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :], res,
             mask=live[:, None, None] & ij_live[None, :, :])
    read = read.to(dtype).to(tl.float32)  # the reference weighs in the streams' dtype
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels, out_ptr,
                       WRITES)
        tl.store(out_ptr + p[:, None] * channels + c[None, :], tl.sum(read[:, :, None] * x, axis=1).to(dtype),
                 mask=live[:, None] & (c[None, :] < channels))


@position_kernel
def _backward_kernel(grad_h_ptr, grad_res_ptr, grad_write_ptr, streams_ptr, phi_ptr, pre_ptr, post_ptr, alpha_ptr,
                     gate_ptr, grad_streams_ptr, phi_shares_ptr, small_shares_ptr, grad_ptr, grad_state_ptr,
                     block_mix_ptr, block_write_ptr, input_ptr, output_ptr, readout_ptr, grad_block_mix_ptr,
                     grad_block_write_ptr, grad_input_ptr, grad_output_ptr, readout_shares_ptr, positions, n, channels,
                     home, eps, WRITES: tl.constexpr, HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr,
                     SHARED: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    outputs = 2 * n + n * n
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    inverse_rms, dynamic = _logits(streams_ptr, phi_ptr, block_mix, block_write, input_ptr, output_ptr, readout,
                                   grad_ptr, grad_ptr, p, i, k, live, n, channels, eps, grad_streams_ptr, WRITES, False,
                                   BLOCK_P, N, K, BLOCK_C)
    # the read's weights' gradient grad_a_i = grad_h . H_i
    grad_a = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_a += tl.sum(grad_h[:, None, :] * x, axis=2)
    alpha_pre = tl.load(alpha_ptr).to(tl.float32)
    alpha_post = tl.load(alpha_ptr + 1).to(tl.float32)
    alpha_res = tl.load(alpha_ptr + 2).to(tl.float32)
    g = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
    dynamic_pre = _pick(dynamic, i, k, 0)
    dynamic_post = _pick(dynamic, i, k, n)
    pre_sigmoid = _sigmoid(tl.load(pre_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :]
                           + alpha_pre * dynamic_pre)
    post_sigmoid = _sigmoid(tl.load(post_ptr + i, mask=i_live, other=0.0).to(tl.float32)[None, :]
                            + alpha_post * dynamic_post)
    home_hot = tl.where(i[None, :] == home, 1.0, 0.0)
    read = home_hot + g * (pre_sigmoid - home_hot)
    grad_write = tl.load(grad_write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0)
    grad_a = tl.where(pi_live, grad_a, 0.0)
    grad_pre = grad_a * g * pre_sigmoid * (1.0 - pre_sigmoid)
    grad_post = grad_write * 2.0 * post_sigmoid * (1.0 - post_sigmoid)
    grad_gate = grad_a * (pre_sigmoid - home_hot)
    if SHARED:
        grad_post = g * grad_post
        grad_gate += grad_write * (2.0 * post_sigmoid - 1.0)
    # H_res's logits' gradient scattered to D's columns 2n + i n + j, and H_pre's and H_post's to i and n + i
    res_offset = k - 2 * n
    in_res = (res_offset >= 0) & (res_offset < n * n)
    grad_res = tl.load(grad_res_ptr + p[:, None] * n * n + res_offset[None, :], mask=live[:, None] & in_res[None, :],
                       other=0.0)  # (P, K)
    scatter_pre = tl.sum(tl.where(k[None, None, :] == i[None, :, None], grad_pre[:, :, None], 0.0), axis=1)
    scatter_post = tl.sum(tl.where(k[None, None, :] == n + i[None, :, None], grad_post[:, :, None], 0.0), axis=1)
    grad_dynamic = alpha_pre * scatter_pre + alpha_post * scatter_post + alpha_res * grad_res
    # this program's shares: b_pre (n), b_post (n), b_res (n n), alpha (3), the gate (1), in one row
    small = small_shares_ptr + program * (2 * n + n * n + 4)
    tl.store(small + i, tl.sum(grad_pre, axis=0), mask=i_live)
    tl.store(small + n + i, tl.sum(grad_post, axis=0), mask=i_live)
    tl.store(small + 2 * n + res_offset, tl.sum(grad_res, axis=0), mask=in_res)
    tail = small + 2 * n + n * n
    tl.store(tail, tl.sum(tl.sum(grad_pre * dynamic_pre, axis=1), axis=0))
    tl.store(tail + 1, tl.sum(tl.sum(grad_post * dynamic_post, axis=1), axis=0))
    tl.store(tail + 2, tl.sum(tl.sum(grad_res * dynamic, axis=1), axis=0))
    tl.store(tail + 3, tl.sum(tl.sum(grad_gate, axis=1), axis=0))
    # RMSNorm's backward over the n C row needs mean(g * normed), g = grad_dynamic phi
    projected = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        w = _phi(phi_ptr, i, k, c, n, outputs, channels)
        gn = tl.sum(grad_dynamic[:, None, :, None] * w[None, :, :, :], axis=2)  # (P, N, C)
        projected += tl.sum(tl.sum(gn * x, axis=2), axis=1)
    projected = projected * inverse_rms / (n * channels)
    # the streams' gradient and this program's share of phi's; where the write comes first, H''s gradient from above
    # and the state's added, and the write's backward run on the sum
    grad_block_mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    grad_block_write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
                       grad_streams_ptr, WRITES)
        w = _phi(phi_ptr, i, k, c, n, outputs, channels)
        gn = tl.sum(grad_dynamic[:, None, :, None] * w[None, :, :, :], axis=2)
        normed = x * inverse_rms[:, None, None]
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_x = inverse_rms[:, None, None] * (gn - normed * projected[:, None, None]) \
            + read[:, :, None] * grad_h[:, None, :]
        grad_phi = tl.sum(grad_dynamic[:, None, :, None] * normed[:, :, None, :], axis=0)  # (N, K, C)
        tl.store(phi_shares_ptr + program * outputs * n * channels + k[None, :, None] * n * channels
                 + i[:, None, None] * channels + c[None, None, :], grad_phi,
                 mask=(i[:, None, None] < n) & (k[None, :, None] < outputs) & (c[None, None, :] < channels))
        grad_block_mix, grad_block_write, grad_readout = read_streams_gradient(
            grad_x, x, grad_ptr, grad_state_ptr, streams_ptr, input_ptr, output_ptr, block_mix, block_write, readout,
            grad_streams_ptr, grad_input_ptr, grad_output_ptr, grad_block_mix, grad_block_write, grad_readout, p, i, c,
            live, n, channels, WRITES, HAS_GRAD, HAS_STATE)
    if WRITES:
        store_write_gradients(grad_block_mix_ptr, grad_block_write_ptr, readout_shares_ptr, grad_block_mix,
                              grad_block_write, grad_readout, program, p, i, live, n)


def _meta(positions: int, n: int):
    return (triton.cdiv(positions, BLOCK_P),), triton.next_power_of_2(n), triton.next_power_of_2(2 * n + n * n)


def _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps, written_by=None):
    positions, n, channels = streams.shape
    out = torch.empty(positions, channels, dtype=streams.dtype, device=streams.device)
    res = torch.empty(positions, n, n, dtype=torch.float32, device=streams.device)
    write = torch.empty(positions, n, dtype=torch.float32, device=streams.device)
    writes = write_outputs(streams, written_by)
    grid, width, outputs = _meta(positions, n)
    _forward_kernel[grid](streams, phi, pre_logits, post_logits, res_logits, alpha, gate, out, res, write, *writes,
                          positions, n, channels, home, eps, WRITES=written_by is not None, SHARED=shared_gate,
                          N=width, K=outputs, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return (out, res, write) if written_by is None else (*writes[5:], out, res, write)


def forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps):
    """h (P, C) in the streams' dtype, H_res's logits (P, n, n) and H_post (P, n) fp32 from contiguous streams
    (P, n, C) and phi (2n + n^2, n C), b_pre, b_post, b_res, alpha (3) and the gate, each in any precision (read in
    fp32)."""
    return _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps)


def forward_after_write(streams, block_mix, block_write, block_input, block_output, readout, phi, pre_logits,
                        post_logits, res_logits, alpha, gate, home, shared_gate, eps):
    """The block's write (:func:`.stream_write.forward`: H' and the state from H (P, n, C), its r (P, n, n),
    b (P, n), h and y (P, C) and o (n)), then the next block's read of H' (:func:`forward`), in one kernel: H', the
    state, h', H_res's logits and H_post."""
    return _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps,
                    (block_mix, block_write, block_input, block_output, readout))


def _backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate, home, shared_gate,
              eps, written_by=None, grad=None, grad_state=None):
    positions, n, channels = streams.shape
    grid, width, outputs = _meta(positions, n)
    grad_streams = torch.empty_like(streams)
    phi_shares = torch.empty(grid[0], *phi.shape, dtype=torch.float32, device=streams.device)
    small_shares = torch.empty(grid[0], 2 * n + n * n + 4, dtype=torch.float32, device=streams.device)
    writes = write_gradients(streams, written_by, grad, grad_state, grid[0])
    _backward_kernel[grid](grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate,
                           grad_streams, phi_shares, small_shares, *writes, positions, n, channels, home, eps,
                           WRITES=written_by is not None, HAS_GRAD=grad is not None,
                           HAS_STATE=grad_state is not None, SHARED=shared_gate, N=width, K=outputs, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    def summed(start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """The programs' shares of columns start..stop summed: each gradient its own tensor (an operator's outputs
        never alias one another)."""
        return small_shares[:, start:stop].sum(0).to(dtype)

    res_start = 2 * n
    alpha_start = res_start + n * n
    read_grads = (phi_shares.sum(0).to(phi.dtype), summed(0, n, pre_logits.dtype),
                  summed(n, res_start, post_logits.dtype), summed(res_start, alpha_start, pre_logits.dtype).view(n, n),
                  summed(alpha_start, alpha_start + 3, alpha.dtype), small_shares[:, -1].sum(0).to(gate.dtype))
    if written_by is None:
        return (grad_streams, *read_grads)
    return (grad_streams, *gathered_write_gradients(writes), *read_grads)


def backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate, home, shared_gate,
             eps):
    """The gradients of the streams, phi, b_pre, b_post, b_res, alpha and the gate given those of the outputs, each
    in its input's precision (b_res's in b_pre's; the small ones cast at once: one module's weights)."""
    return _backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate, home,
                     shared_gate, eps)


def backward_after_write(grad, grad_state, grad_read, grad_res, grad_write, streams, block_mix, block_write,
                         block_input, block_output, readout, phi, pre_logits, post_logits, alpha, gate, home,
                         shared_gate, eps):
    """:func:`forward_after_write`'s backward: the gradients of H, r, b, h, y, o, phi, b_pre, b_post, b_res, alpha and
    the gate given those of H' and the state (None: not used) and of h', H_res's logits and H_post; H''s complete
    gradient is summed in registers and never stored."""
    return _backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate, home,
                     shared_gate, eps, (block_mix, block_write, block_input, block_output, readout), grad, grad_state)
