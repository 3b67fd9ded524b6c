"""mHC's read in Triton kernels (:mod:`..ops.mhc_read`): one forward, two backward.

Per position, with the n streams H (n x C) read as one row of n C: D = RMSNorm(H) phi^T (2n + n^2), the logits
pre, post and res, H_pre = e_home + g (sigmoid(pre) - e_home), H_post = 2 sigmoid(post) (with ``SHARED``, a
checkpoint of the start before: 1 + g (2 sigmoid(post) - 1)) and h = sum_i H_pre,i H_i, in fp32 whatever the
streams' precision. Between two blocks the same kernels also run the write of the block below first (``WRITES``:
H' from H, r, b, h and y, :mod:`.stream_write`), as :mod:`.hyper_read`'s do.

What each kernel reads and writes, the streams being the large tensors (n C per position):

* forward, a program per ``BLOCK_P`` positions: the streams once for their RMS and the projection D (``tl.dot`` of a
  tile of positions with phi's columns, :func:`.common.tile_dot`; phi read once a program), then once more for the
  read, which needs the whole row's logits first; D and 1/RMS are stored for the backward (2n + n^2 + 1 floats a
  position). With ``WRITES`` the first pass computes H' from the write's inputs and stores it and the state, the
  second reads H' as stored.
* backward, :func:`_weights_backward_kernel`, a program per ``WEIGHTS_BLOCK_P`` positions: the streams (H' as
  stored) and dh once, for the read's gradient grad_a_i = dh . H_i; from it and the saved D and 1/RMS, the logits'
  gradient G (2n + n^2), the read weights and RMSNorm's mean(g . normed) = G . D / (n C) (so no pass over the
  streams recomputes it), stored per position; the static weights' gradients as one small row a program.
* backward, :func:`_streams_backward_kernel`, a program per ``STREAMS_BLOCK_C`` channels of every stream and one of
  ``SPLITS`` ranges of positions: phi's columns read once, the streams (with ``WRITES``: the write's inputs, from
  which H' is recomputed) and dh once; the streams' gradient 1/RMS (G phi - normed mean(g . normed)) + H_pre dh
  (``tl.dot``), and phi's gradient G^T normed accumulated over the range's positions (``tl.dot``) and stored once a
  program (summed over the ranges afterwards: deterministic). With ``WRITES`` the gradient of H' from above and the
  state's are added and the write's backward runs on the sum, its per-position sums over channels (the gradients of
  r and b) stored per channel block and summed afterwards.

So each pass reads the streams once; the two that the per-position logits force (they need the whole row before any
channel's output) are the floor without holding the row on chip. n and 2n + n^2 are padded to powers of two
(2n + n^2 to at least 16, ``tl.dot``'s smallest tile) with zeros.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .common import position_kernel, stream_chunk, tile_dot, tile_products_in_tf32
from .stream_write import (block_write_weights, read_chunk, store_written, streams_gradient, streams_tile,
                           write_outputs)

#: Forward: positions per program (phi is read once a program) and channels per chunk (of each stream: at least 16
#: in all, ``tl.dot``'s smallest tile), in 8 warps.
BLOCK_P = 64
BLOCK_C = 8
#: Backward, the read's gradient: positions per program, channels per chunk.
WEIGHTS_BLOCK_P = 16
WEIGHTS_BLOCK_C = 64
#: Backward, the streams' and phi's gradients: positions per tile, channels per program (in 8 warps, phi's tile and its
#: gradient's, K x n x 32 each, in registers), ranges of positions (phi's gradient is written once a range: SPLITS
#: shares of phi at every batch size, so that a 16k-token batch has channel blocks x SPLITS programs).
STREAMS_BLOCK_P = 16
STREAMS_BLOCK_C = 32
SPLITS = 32


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _phi_tile(phi_ptr, k, i, c, n, outputs, channels, N: tl.constexpr, K: tl.constexpr, BLOCK_C: tl.constexpr):
    """phi's columns i C + c for every row k, as (K, N * BLOCK_C) fp32 with stream i's channels together; zero where
    padded."""
    inside = (k[:, None, None] < outputs) & (i[None, :, None] < n) & (c[None, None, :] < channels)
    w = tl.load(phi_ptr + k[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :],
                mask=inside, other=0.0).to(tl.float32)
    return tl.reshape(w, (K, N * BLOCK_C))


@triton.jit
def _pick(values, i, k, offset):
    """values[:, offset + i] as (P, N) from (P, K)."""
    return tl.sum(tl.where(k[None, None, :] == offset + i[None, :, None], values[:, None, :], 0.0), axis=2)


@triton.jit
def _static(ptr, i, n):
    return tl.load(ptr + i, mask=i < n, other=0.0).to(tl.float32)[None, :]


@position_kernel
def _forward_kernel(streams_ptr, phi_ptr, pre_ptr, post_ptr, res_ptr, alpha_ptr, gate_ptr, out_ptr, out_res_ptr,
                    out_write_ptr, dynamic_ptr, inverse_rms_ptr, block_mix_ptr, block_write_ptr, input_ptr,
                    output_ptr, readout_ptr, written_ptr, state_ptr, positions, n, res_width, channels, home, eps,
                    WRITES: tl.constexpr, SHARED: tl.constexpr, LOW: tl.constexpr, N: tl.constexpr,
                    R: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    r = tl.arange(0, R)
    k = tl.arange(0, K)
    live = p < positions
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    outputs = 2 * n + res_width
    dtype = out_ptr.dtype.element_ty
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    # pass 1: the row's sum of squares and its projection on phi's rows (with WRITES: H' computed and stored)
    total = tl.zeros((BLOCK_P,), dtype=tl.float32)
    projected = tl.zeros((BLOCK_P, K), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels, out_ptr,
                       WRITES)
        if WRITES:
            store_written(written_ptr, state_ptr, x, readout, p, i, c, live, n, channels)
        total += tl.sum(tl.sum(x * x, axis=2), axis=1)
        w = _phi_tile(phi_ptr, k, i, c, n, outputs, channels, N, K, BLOCK_C)
        projected += tile_dot(tl.reshape(x, (BLOCK_P, N * BLOCK_C)), tl.trans(w), LOW)
    inverse_rms = 1.0 / tl.sqrt(total / (n * channels) + eps)
    dynamic = projected * inverse_rms[:, None]
    tl.store(dynamic_ptr + p[:, None] * outputs + k[None, :], dynamic, mask=live[:, None] & (k[None, :] < outputs))
    tl.store(inverse_rms_ptr + p, inverse_rms, mask=live)
    alpha_pre = tl.load(alpha_ptr).to(tl.float32)
    alpha_post = tl.load(alpha_ptr + 1).to(tl.float32)
    alpha_res = tl.load(alpha_ptr + 2).to(tl.float32)
    g = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
    pre = _static(pre_ptr, i, n) + alpha_pre * _pick(dynamic, i, k, 0)
    post = _static(post_ptr, i, n) + alpha_post * _pick(dynamic, i, k, n)
    read = g * _sigmoid(pre) + tl.where(i[None, :] == home, 1.0 - g, 0.0)
    if SHARED:
        write = 1.0 + g * (2.0 * _sigmoid(post) - 1.0)
    else:
        write = 2.0 * _sigmoid(post)
    tl.store(out_write_ptr + p[:, None] * n + i[None, :], write, mask=pi_live)
    # H_res's logits b_res,r + alpha_2 D[2n + r], r over H_res's R parameters (mHC: its n n entries, row by row)
    res = _pick(dynamic, r, k, 2 * n)
    static_res = tl.load(res_ptr + r, mask=r < res_width, other=0.0).to(tl.float32)
    tl.store(out_res_ptr + p[:, None] * res_width + r[None, :], static_res[None, :] + alpha_res * res,
             mask=live[:, None] & (r[None, :] < res_width))
    # pass 2: the read, of the streams (with WRITES: of H' as stored by this program)
    read = read.to(dtype).to(tl.float32)  # the reference weighs in the streams' dtype
    source = streams_ptr
    if WRITES:
        source = written_ptr
        tl.debug_barrier()  # this program's stores of H' visible to all its threads
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(source, p, i, c, live, n, channels)
        tl.store(out_ptr + p[:, None] * channels + c[None, :], tl.sum(read[:, :, None] * x, axis=1).to(dtype),
                 mask=live[:, None] & (c[None, :] < channels))


@position_kernel
def _weights_backward_kernel(grad_h_ptr, grad_res_ptr, grad_write_ptr, streams_ptr, dynamic_ptr, pre_ptr, post_ptr,
                             alpha_ptr, gate_ptr, grad_dynamic_ptr, scalars_ptr, small_shares_ptr, positions, n,
                             res_width, channels, home, SHARED: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per position: G, the logits' gradient, into grad_dynamic (P, 2n + n^2); H_pre and mean(g . normed) into
    scalars (P, n + 1); the static weights' gradients (b_pre, b_post, b_res, alpha, the gate) of this program's
    positions as one row of small_shares."""
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    i_live = i < n
    pi_live = live[:, None] & i_live[None, :]
    outputs = 2 * n + res_width
    # the read's weights' gradient grad_a_i = dh . H_i
    grad_a = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_a += tl.sum(grad_h[:, None, :] * x, axis=2)
    pk_live = live[:, None] & (k[None, :] < outputs)
    dynamic = tl.load(dynamic_ptr + p[:, None] * outputs + k[None, :], mask=pk_live, other=0.0)
    alpha_pre = tl.load(alpha_ptr).to(tl.float32)
    alpha_post = tl.load(alpha_ptr + 1).to(tl.float32)
    alpha_res = tl.load(alpha_ptr + 2).to(tl.float32)
    g = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
    dynamic_pre = _pick(dynamic, i, k, 0)
    dynamic_post = _pick(dynamic, i, k, n)
    pre_sigmoid = _sigmoid(_static(pre_ptr, i, n) + alpha_pre * dynamic_pre)
    post_sigmoid = _sigmoid(_static(post_ptr, i, n) + alpha_post * dynamic_post)
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
    # H_res's logits' gradient at D's columns 2n + r, and H_pre's and H_post's at i and n + i
    res_offset = k - 2 * n
    in_res = (res_offset >= 0) & (res_offset < res_width)
    grad_res = tl.load(grad_res_ptr + p[:, None] * res_width + res_offset[None, :],
                       mask=live[:, None] & in_res[None, :], other=0.0)  # (P, K)
    scatter_pre = tl.sum(tl.where(k[None, None, :] == i[None, :, None], grad_pre[:, :, None], 0.0), axis=1)
    scatter_post = tl.sum(tl.where(k[None, None, :] == n + i[None, :, None], grad_post[:, :, None], 0.0), axis=1)
    grad_dynamic = alpha_pre * scatter_pre + alpha_post * scatter_post + alpha_res * grad_res
    tl.store(grad_dynamic_ptr + p[:, None] * outputs + k[None, :], grad_dynamic, mask=pk_live)
    # RMSNorm's backward needs mean(g . normed) over the row, g = G phi: sum_k G_k D_k / (n C), D = normed phi^T
    tl.store(scalars_ptr + p[:, None] * (n + 1) + i[None, :], read, mask=pi_live)
    tl.store(scalars_ptr + p * (n + 1) + n, tl.sum(grad_dynamic * dynamic, axis=1) / (n * channels), mask=live)
    # this program's shares: b_pre (n), b_post (n), b_res (R), alpha (3), the gate (1), in one row
    small = small_shares_ptr + program * (outputs + 4)
    tl.store(small + i, tl.sum(grad_pre, axis=0), mask=i_live)
    tl.store(small + n + i, tl.sum(grad_post, axis=0), mask=i_live)
    tl.store(small + 2 * n + res_offset, tl.sum(grad_res, axis=0), mask=in_res)
    tail = small + outputs
    tl.store(tail, tl.sum(tl.sum(grad_pre * dynamic_pre, axis=1), axis=0))
    tl.store(tail + 1, tl.sum(tl.sum(grad_post * dynamic_post, axis=1), axis=0))
    tl.store(tail + 2, tl.sum(tl.sum(grad_res * dynamic, axis=1), axis=0))
    tl.store(tail + 3, tl.sum(tl.sum(grad_gate, axis=1), axis=0))


@position_kernel
def _streams_backward_kernel(grad_h_ptr, streams_ptr, phi_ptr, grad_dynamic_ptr, inverse_rms_ptr, scalars_ptr,
                             grad_streams_ptr, phi_shares_ptr, grad_ptr, grad_state_ptr, block_mix_ptr,
                             block_write_ptr, input_ptr, output_ptr, readout_ptr, grad_input_ptr, grad_output_ptr,
                             write_shares_ptr, readout_shares_ptr, positions, n, res_width, channels,
                             WRITES: tl.constexpr,
                             HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr, LOW: tl.constexpr, N: tl.constexpr,
                             K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Channels c of every stream over one range of positions: the streams' gradient (with WRITES: the write's
    backward run on H''s), this range's share of phi's gradient at c, and with WRITES the gradients of r and b summed
    over c (one share per channel block) and the readout's share."""
    block = tl.program_id(0)
    split = tl.program_id(1)
    c = block * BLOCK_C + tl.arange(0, BLOCK_C)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    outputs = 2 * n + res_width
    blocks = tl.num_programs(0)
    # phi's columns of this block, once; its gradient's, accumulated over the range's positions
    w = _phi_tile(phi_ptr, k, i, c, n, outputs, channels, N, K, BLOCK_C)  # (K, N BLOCK_C)
    grad_phi = tl.zeros((K, N * BLOCK_C), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    tiles = tl.cdiv(tl.cdiv(positions, BLOCK_P), tl.num_programs(1))
    for tile in range(split * tiles, (split + 1) * tiles):
        p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
        live = p < positions
        pc_live = live[:, None] & (c[None, :] < channels)
        pk_live = live[:, None] & (k[None, :] < outputs)
        grad_dynamic = tl.load(grad_dynamic_ptr + p[:, None] * outputs + k[None, :], mask=pk_live, other=0.0)
        inverse_rms = tl.load(inverse_rms_ptr + p, mask=live, other=0.0)
        read = tl.load(scalars_ptr + p[:, None] * (n + 1) + i[None, :], mask=live[:, None] & (i[None, :] < n),
                       other=0.0)
        mean_projected = tl.load(scalars_ptr + p * (n + 1) + n, mask=live, other=0.0)
        x, block_mix, block_write, readout, before, block_input, block_output = streams_tile(
            streams_ptr, block_mix_ptr, block_write_ptr, input_ptr, output_ptr, readout_ptr, grad_streams_ptr, p, i, c,
            live, n, channels, WRITES, N)
        normed = x * inverse_rms[:, None, None]
        gn = tl.reshape(tile_dot(grad_dynamic, w, LOW), (BLOCK_P, N, BLOCK_C))
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
        grad_x = inverse_rms[:, None, None] * (gn - normed * mean_projected[:, None, None]) \
            + read[:, :, None] * grad_h[:, None, :]
        grad_phi += tile_dot(tl.trans(grad_dynamic), tl.reshape(normed, (BLOCK_P, N * BLOCK_C)), LOW)
        grad_readout = streams_gradient(grad_x, x, block_mix, block_write, readout, before, block_input, block_output,
                                        grad_ptr, grad_state_ptr, grad_streams_ptr, grad_input_ptr, grad_output_ptr,
                                        write_shares_ptr, grad_readout, p, i, c, live, n, channels, block, blocks,
                                        WRITES, HAS_GRAD, HAS_STATE, BLOCK_P, N)
    columns = tl.reshape(i[:, None] * channels + c[None, :], (N * BLOCK_C,))
    column_live = tl.reshape((i[:, None] < n) & (c[None, :] < channels), (N * BLOCK_C,))
    tl.store(phi_shares_ptr + split * outputs * n * channels + k[:, None] * n * channels + columns[None, :], grad_phi,
             mask=(k[:, None] < outputs) & column_live[None, :])
    if WRITES:
        tl.store(readout_shares_ptr + (split * blocks + block) * n + i, grad_readout, mask=i < n)


def _widths(n: int, res_width: int):
    """N, R and K: n, H_res's parameters R and 2n + R padded to powers of two, K to at least ``tl.dot``'s 16."""
    return (triton.next_power_of_2(n), triton.next_power_of_2(res_width),
            max(16, triton.next_power_of_2(2 * n + res_width)))


def _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps, written_by=None):
    positions, n, channels = streams.shape
    res_width = res_logits.numel()
    out = torch.empty(positions, channels, dtype=streams.dtype, device=streams.device)
    res = torch.empty(positions, *res_logits.shape, dtype=torch.float32, device=streams.device)
    write = torch.empty(positions, n, dtype=torch.float32, device=streams.device)
    dynamic = torch.empty(positions, 2 * n + res_width, dtype=torch.float32, device=streams.device)
    inverse_rms = torch.empty(positions, dtype=torch.float32, device=streams.device)
    writes = write_outputs(streams, written_by)
    width, res_padded, outputs = _widths(n, res_width)
    _forward_kernel[(triton.cdiv(positions, BLOCK_P),)](
        streams, phi, pre_logits, post_logits, res_logits, alpha, gate, out, res, write, dynamic, inverse_rms, *writes,
        positions, n, res_width, channels, home, eps, WRITES=written_by is not None, SHARED=shared_gate,
        LOW=tile_products_in_tf32(streams, phi), N=width, R=res_padded, K=outputs, BLOCK_P=BLOCK_P,
        BLOCK_C=max(BLOCK_C, 16 // width), num_warps=8)
    read = (out, res, write, dynamic, inverse_rms)
    return read if written_by is None else (*writes[5:], *read)


def forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps):
    """h (P, C) in the streams' dtype, H_res's logits (P, *b_res's shape) and H_post (P, n) fp32 from contiguous
    streams (P, n, C) and phi (2n + R, n C), b_pre, b_post, b_res (R entries: mHC's (n, n), mHC-lite's (n!)), alpha (3)
    and the gate, each in any precision (read in fp32); then, for the backward, D (P, 2n + R) and 1/RMS (P), fp32."""
    return _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps)


def forward_after_write(streams, block_mix, block_write, block_input, block_output, readout, phi, pre_logits,
                        post_logits, res_logits, alpha, gate, home, shared_gate, eps):
    """The block's write (:func:`.stream_write.forward`: H' and the state from H (P, n, C), its r (P, n, n),
    b (P, n), h and y (P, C) and o (n)), then the next block's read of H' (:func:`forward`), in one kernel: H', the
    state, h', H_res's logits, H_post, D and 1/RMS."""
    return _forward(streams, phi, pre_logits, post_logits, res_logits, alpha, gate, home, shared_gate, eps,
                    (block_mix, block_write, block_input, block_output, readout))


def _backward(grad_read, grad_res, grad_write, read_streams, streams, phi, pre_logits, post_logits, alpha, gate,
              dynamic, inverse_rms, home, shared_gate, written_by=None, grad=None, grad_state=None):
    """``read_streams``: the streams the read read (H' as stored, where the write comes first); ``streams``: the
    kernel's streams argument (H before the write, where it comes first)."""
    positions, n, channels = streams.shape
    res_shape = grad_res.shape[1:]
    res_width = grad_res[0].numel()
    width, _, outputs = _widths(n, res_width)
    device = streams.device
    grad_dynamic = torch.empty(positions, 2 * n + res_width, dtype=torch.float32, device=device)
    scalars = torch.empty(positions, n + 1, dtype=torch.float32, device=device)
    programs = triton.cdiv(positions, WEIGHTS_BLOCK_P)
    small_shares = torch.empty(programs, 2 * n + res_width + 4, dtype=torch.float32, device=device)
    _weights_backward_kernel[(programs,)](
        grad_read, grad_res, grad_write, read_streams, dynamic, pre_logits, post_logits, alpha, gate, grad_dynamic,
        scalars, small_shares, positions, n, res_width, channels, home, SHARED=shared_gate, N=width, K=outputs,
        BLOCK_P=WEIGHTS_BLOCK_P, BLOCK_C=WEIGHTS_BLOCK_C)
    blocks = triton.cdiv(channels, STREAMS_BLOCK_C)
    splits = SPLITS  # whatever the batch: phi's gradient costs the same shares at every batch size
    grad_streams = torch.empty_like(streams)
    phi_shares = torch.empty(splits, *phi.shape, dtype=torch.float32, device=device)
    if written_by is None:
        write_args = (streams,) * 11
    else:
        block_mix, block_write, block_input, block_output, readout = written_by
        write_args = (streams if grad is None else grad, streams if grad_state is None else grad_state, *written_by,
                      torch.empty_like(block_input), torch.empty_like(block_output),
                      torch.empty(positions, blocks, n * n + n, dtype=torch.float32, device=device),
                      torch.empty(splits * blocks, n, dtype=torch.float32, device=device))
    _streams_backward_kernel[(blocks, splits)](
        grad_read, streams, phi, grad_dynamic, inverse_rms, scalars, grad_streams, phi_shares, *write_args, positions,
        n, res_width, channels, WRITES=written_by is not None, HAS_GRAD=grad is not None, HAS_STATE=grad_state is not None,
        LOW=tile_products_in_tf32(streams, phi), N=width, K=outputs, BLOCK_P=STREAMS_BLOCK_P,
        BLOCK_C=STREAMS_BLOCK_C, num_warps=8, num_stages=1)

    def summed(start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """The programs' shares of columns start..stop summed: each gradient its own tensor (an operator's outputs
        never alias one another)."""
        return small_shares[:, start:stop].sum(0).to(dtype)

    res_start = 2 * n
    alpha_start = res_start + res_width
    read_grads = (phi_shares.sum(0).to(phi.dtype), summed(0, n, pre_logits.dtype),
                  summed(n, res_start, post_logits.dtype),
                  summed(res_start, alpha_start, pre_logits.dtype).view(res_shape),
                  summed(alpha_start, alpha_start + 3, alpha.dtype), small_shares[:, -1].sum(0).to(gate.dtype))
    if written_by is None:
        return (grad_streams, *read_grads)
    write_shares = write_args[9]  # each gradient summed on its own: an operator's outputs never alias one another
    grad_mix = write_shares[..., :n * n].sum(1).view(positions, n, n).to(block_mix.dtype)
    grad_write = write_shares[..., n * n:].sum(1).to(block_write.dtype)
    grad_readout = write_args[10].sum(0).to(readout.dtype)
    return (grad_streams, grad_mix, grad_write, write_args[7], write_args[8], grad_readout, *read_grads)


def backward(grad_read, grad_res, grad_write, streams, phi, pre_logits, post_logits, alpha, gate, dynamic,
             inverse_rms, home, shared_gate):
    """The gradients of the streams, phi, b_pre, b_post, b_res, alpha and the gate given those of the outputs and the
    forward's D and 1/RMS, each in its input's precision (b_res's in b_pre's; the small ones cast at once: one
    module's weights)."""
    return _backward(grad_read, grad_res, grad_write, streams, streams, phi, pre_logits, post_logits, alpha, gate,
                     dynamic, inverse_rms, home, shared_gate)


def backward_after_write(grad, grad_state, grad_read, grad_res, grad_write, streams, written, block_mix, block_write,
                         block_input, block_output, readout, phi, pre_logits, post_logits, alpha, gate, dynamic,
                         inverse_rms, home, shared_gate):
    """:func:`forward_after_write`'s backward: the gradients of H, r, b, h, y, o, phi, b_pre, b_post, b_res, alpha and
    the gate given those of H' and the state (None: not used) and of h', H_res's logits and H_post, with the H'
    the forward stored (``written``) and its D and 1/RMS; H''s complete gradient is summed in registers and never
    stored."""
    return _backward(grad_read, grad_res, grad_write, written, streams, phi, pre_logits, post_logits, alpha, gate,
                     dynamic, inverse_rms, home, shared_gate, (block_mix, block_write, block_input, block_output,
                                                               readout), grad, grad_state)
