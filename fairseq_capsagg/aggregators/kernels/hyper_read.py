"""A hyper-connection's read in Triton kernels (:mod:`..ops.hyper_read`): one forward, two backward.

Per position, with the n streams H (n x C): G = tanh(D), D = RMSNorm(H) W^T (n x (n + 2), each stream normalised on
its own), a = A_m + s_a G[:, 0], r = A_r + s_a G[:, 1:n+1], b = B + s_b G[:, n+1] and h = sum_i a_i H_i, in fp32
whatever the streams' precision. Between two blocks the same kernels also run the write of the block below first
(``WRITES``: H' from H, r, b, h and y, :mod:`.stream_write`).

The passes, as :mod:`.mhc_read`'s (whose docstring says why two passes over the streams each way are the floor):

* forward, a program per ``BLOCK_P`` positions: the streams once for their RMS and D (``tl.dot`` of the tile's
  n P rows with W's columns; W read once a program), D and 1/RMS stored for the backward; then once more for the
  read (with ``WRITES``: H' as the first pass stored it).
* backward, :func:`_weights_backward_kernel`, a program per ``WEIGHTS_BLOCK_P`` positions: the streams and dh once,
  for the read's gradient; from it and the saved D, the gates' gradient before tanh, the read weights and each
  stream's RMSNorm mean(g . normed) = sum_k G'_k D_k / C, stored per position and stream; the static weights' and
  scales' gradients as one small row a program.
* backward, :func:`_streams_backward_kernel`, a program per ``STREAMS_BLOCK_C`` channels and one of ``SPLITS`` ranges
  of positions: W's columns once; the streams (with ``WRITES``: the write's inputs) and dh once; the streams'
  gradient and W's accumulated over the range (``tl.dot``), stored once a program; with ``WRITES`` the write's
  backward on H''s whole gradient, its sums over channels stored per channel block.

n is padded to a power of two, n + 2 to a power of two of at least 16 (``tl.dot``'s smallest tile), with zeros.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .common import position_kernel, stream_chunk, tile_dot, tile_products_in_tf32
from .stream_write import (block_write_weights, read_chunk, store_written, streams_gradient, streams_tile,
                           write_outputs)

#: Forward: positions per program (W is read once a program) and channels per chunk.
BLOCK_P = 32
BLOCK_C = 32
#: Backward, the read's gradient: positions per program, channels per chunk.
WEIGHTS_BLOCK_P = 16
WEIGHTS_BLOCK_C = 64
#: Backward, the streams' and W's gradients: positions per tile (16 rows of a position's stream), channels per program,
#: ranges of positions (W's gradient written once a range: SPLITS shares at every batch size).
STREAMS_BLOCK_C = 128
SPLITS = 32


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
                    out_mix_ptr, out_write_ptr, dynamic_ptr, inverse_rms_ptr, block_mix_ptr, block_write_ptr,
                    input_ptr, output_ptr, readout_ptr, written_ptr, state_ptr, positions, n, channels, eps,
                    WRITES: tl.constexpr, LOW: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    dtype = out_ptr.dtype.element_ty
    block_mix, block_write, readout = block_write_weights(block_mix_ptr, block_write_ptr, readout_ptr, p, i, live, n,
                                                          BLOCK_P, N, WRITES)
    # pass 1: each stream's sum of squares and projection on W's rows (with WRITES: H' computed and stored)
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
        acc += tl.reshape(tile_dot(tl.reshape(x, (BLOCK_P * N, BLOCK_C)), tl.trans(w), LOW), (BLOCK_P, N, K))
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    dynamic = acc * inverse_rms[:, :, None]
    pi_live = live[:, None] & (i[None, :] < n)
    tl.store(dynamic_ptr + (p[:, None, None] * n + i[None, :, None]) * outputs + k[None, None, :], dynamic,
             mask=pi_live[:, :, None] & (k[None, None, :] < outputs))
    tl.store(inverse_rms_ptr + p[:, None] * n + i[None, :], inverse_rms, mask=pi_live)
    read = read_weights(tanh(dynamic), p, i, k, live, n, read_ptr, mix_ptr, write_ptr, scale_a_ptr, scale_b_ptr,
                        out_mix_ptr, out_write_ptr)
    read = read.to(dtype).to(tl.float32)  # the reference weighs in the streams' dtype
    # pass 2: the read, of the streams (with WRITES: of H' as stored by this program)
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
def _weights_backward_kernel(grad_h_ptr, grad_mix_ptr, grad_write_ptr, streams_ptr, dynamic_ptr, read_ptr,
                             scale_a_ptr, scale_b_ptr, grad_pre_ptr, scalars_ptr, read_shares_ptr, mix_shares_ptr,
                             write_shares_ptr, scale_shares_ptr, positions, n, channels, N: tl.constexpr,
                             K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per position and stream: the gates' gradient before tanh into grad_pre (P, n, n + 2), a and RMSNorm's
    mean(g . normed) into scalars (P, n, 2); the static weights' and scales' gradients of this program's positions as
    its shares."""
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    live = p < positions
    outputs = n + 2
    # the read's weights' gradient grad_a_i = dh . H_i
    grad_a = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
        grad_a += tl.sum(grad_h[:, None, :] * x, axis=2)
    pi_live = live[:, None] & (i[None, :] < n)
    inside = pi_live[:, :, None] & (k[None, None, :] < outputs)
    offsets = (p[:, None, None] * n + i[None, :, None]) * outputs + k[None, None, :]
    dynamic = tl.load(dynamic_ptr + offsets, mask=inside, other=0.0)
    grad_pre, read = gates_backward(tanh(dynamic), grad_a, program, p, i, k, live, n, grad_mix_ptr, grad_write_ptr,
                                    read_ptr, scale_a_ptr, scale_b_ptr, read_shares_ptr, mix_shares_ptr,
                                    write_shares_ptr, scale_shares_ptr)
    tl.store(grad_pre_ptr + offsets, grad_pre, mask=inside)
    # each stream's RMSNorm backward needs mean(g . normed) over its channels, g = G' W: sum_k G'_k D_k / C
    scalars = scalars_ptr + (p[:, None] * n + i[None, :]) * 2
    tl.store(scalars, read, mask=pi_live)
    tl.store(scalars + 1, tl.sum(tl.where(inside, grad_pre * dynamic, 0.0), axis=2) / channels, mask=pi_live)


@position_kernel
def _streams_backward_kernel(grad_h_ptr, streams_ptr, w_ptr, grad_pre_ptr, inverse_rms_ptr, scalars_ptr,
                             grad_streams_ptr, w_shares_ptr, grad_ptr, grad_state_ptr, block_mix_ptr,
                             block_write_ptr, input_ptr, output_ptr, readout_ptr, grad_input_ptr, grad_output_ptr,
                             write_shares_ptr, readout_shares_ptr, positions, n, channels, WRITES: tl.constexpr,
                             HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr, LOW: tl.constexpr, N: tl.constexpr,
                             K: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Channels c of every stream over one range of positions: the streams' gradient (with WRITES: the write's
    backward run on H''s), this range's share of W's gradient at c, and with WRITES the gradients of r and b summed
    over c (one share per channel block) and the readout's share."""
    block = tl.program_id(0)
    split = tl.program_id(1)
    c = block * BLOCK_C + tl.arange(0, BLOCK_C)
    i = tl.arange(0, N)
    k = tl.arange(0, K)
    outputs = n + 2
    blocks = tl.num_programs(0)
    w = projection_chunk(w_ptr, k, c, outputs, channels)  # (K, BLOCK_C), once
    grad_w = tl.zeros((K, BLOCK_C), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    tiles = tl.cdiv(tl.cdiv(positions, BLOCK_P), tl.num_programs(1))
    for tile in range(split * tiles, (split + 1) * tiles):
        p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
        live = p < positions
        pc_live = live[:, None] & (c[None, :] < channels)
        pi_live = live[:, None] & (i[None, :] < n)
        grad_pre = tl.load(grad_pre_ptr + (p[:, None, None] * n + i[None, :, None]) * outputs + k[None, None, :],
                           mask=pi_live[:, :, None] & (k[None, None, :] < outputs), other=0.0)
        inverse_rms = tl.load(inverse_rms_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0)
        scalars = scalars_ptr + (p[:, None] * n + i[None, :]) * 2
        read = tl.load(scalars, mask=pi_live, other=0.0)
        mean_projected = tl.load(scalars + 1, mask=pi_live, other=0.0)
        x, block_mix, block_write, readout, before, block_input, block_output = streams_tile(
            streams_ptr, block_mix_ptr, block_write_ptr, input_ptr, output_ptr, readout_ptr, grad_streams_ptr, p, i, c,
            live, n, channels, WRITES, N)
        normed = x * inverse_rms[:, :, None]
        rows = tl.reshape(grad_pre, (BLOCK_P * N, K))
        gn = tl.reshape(tile_dot(rows, w, LOW), (BLOCK_P, N, BLOCK_C))
        grad_h = tl.load(grad_h_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
        grad_x = inverse_rms[:, :, None] * (gn - normed * mean_projected[:, :, None]) \
            + read[:, :, None] * grad_h[:, None, :]
        grad_w += tile_dot(tl.trans(rows), tl.reshape(normed, (BLOCK_P * N, BLOCK_C)), LOW)
        grad_readout = streams_gradient(grad_x, x, block_mix, block_write, readout, before, block_input, block_output,
                                        grad_ptr, grad_state_ptr, grad_streams_ptr, grad_input_ptr, grad_output_ptr,
                                        write_shares_ptr, grad_readout, p, i, c, live, n, channels, block, blocks,
                                        WRITES, HAS_GRAD, HAS_STATE, BLOCK_P, N)
    tl.store(w_shares_ptr + split * outputs * channels + k[:, None] * channels + c[None, :], grad_w,
             mask=(k[:, None] < outputs) & (c[None, :] < channels))
    if WRITES:
        tl.store(readout_shares_ptr + (split * blocks + block) * n + i, grad_readout, mask=i < n)


def _widths(n: int):
    """N and K: n and n + 2 padded to powers of two, K to at least ``tl.dot``'s 16."""
    return triton.next_power_of_2(n), max(16, triton.next_power_of_2(n + 2))


def _tile_positions(width: int) -> int:
    """Positions per tile of a tile product whose rows are (position, stream): 16 rows, ``tl.dot``'s smallest."""
    return max(1, 16 // width)


def _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps,
             written_by=None):
    positions, n, channels = streams.shape
    device = streams.device
    out = torch.empty(positions, channels, dtype=streams.dtype, device=device)
    mix = torch.empty(positions, n, n, dtype=torch.float32, device=device)
    write = torch.empty(positions, n, dtype=torch.float32, device=device)
    dynamic = torch.empty(positions, n, n + 2, dtype=torch.float32, device=device)
    inverse_rms = torch.empty(positions, n, dtype=torch.float32, device=device)
    writes = write_outputs(streams, written_by)
    width, outputs = _widths(n)
    _forward_kernel[(triton.cdiv(positions, BLOCK_P),)](
        streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, out, mix, write,
        dynamic, inverse_rms, *writes, positions, n, channels, eps, WRITES=written_by is not None,
        LOW=tile_products_in_tf32(streams, projection), N=width, K=outputs, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C,
        num_warps=8)
    read = (out, mix, write, dynamic, inverse_rms)
    return read if written_by is None else (*writes[5:], *read)


def forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps):
    """h (P, C) in the streams' dtype, r (P, n, n) and b (P, n) fp32 from contiguous streams (P, n, C), W (n + 2, C),
    A_m (n), A_r (n, n), B (n) and the scalars s_a, s_b, each in any precision (read in fp32); then, for the
    backward, D (P, n, n + 2) and 1/RMS (P, n), fp32."""
    return _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps)


def forward_after_write(streams, block_mix, block_write, block_input, block_output, readout, projection, static_read,
                        static_mix, static_write, read_mix_scale, write_scale, eps):
    """The block's write (:func:`.stream_write.forward`: H' and the state from H (P, n, C), its r (P, n, n),
    b (P, n), h and y (P, C) and o (n)), then the next block's read of H' (:func:`forward`), in one kernel: H', the
    state, h', r', b', D and 1/RMS."""
    return _forward(streams, projection, static_read, static_mix, static_write, read_mix_scale, write_scale, eps,
                    (block_mix, block_write, block_input, block_output, readout))


def _backward(grad_read, grad_mix, grad_write, read_streams, streams, projection, static_read, read_mix_scale,
              write_scale, dynamic, inverse_rms, written_by=None, grad=None, grad_state=None):
    """``read_streams``: the streams the read read (H' as stored, where the write comes first); ``streams``: the
    kernel's streams argument (H before the write, where it comes first)."""
    positions, n, channels = streams.shape
    width, outputs = _widths(n)
    device = streams.device
    programs = triton.cdiv(positions, WEIGHTS_BLOCK_P)
    grad_pre = torch.empty(positions, n, n + 2, dtype=torch.float32, device=device)
    scalars = torch.empty(positions, n, 2, dtype=torch.float32, device=device)
    shares = {name: torch.empty(programs, *shape, dtype=torch.float32, device=device)
              for name, shape in (("read", (n,)), ("mix", (n, n)), ("write", (n,)), ("scales", (2,)))}
    _weights_backward_kernel[(programs,)](
        grad_read, grad_mix, grad_write, read_streams, dynamic, static_read, read_mix_scale, write_scale, grad_pre,
        scalars, shares["read"], shares["mix"], shares["write"], shares["scales"], positions, n, channels, N=width,
        K=outputs, BLOCK_P=WEIGHTS_BLOCK_P, BLOCK_C=WEIGHTS_BLOCK_C)
    blocks = triton.cdiv(channels, STREAMS_BLOCK_C)
    grad_streams = torch.empty_like(streams)
    w_shares = torch.empty(SPLITS, *projection.shape, dtype=torch.float32, device=device)
    if written_by is None:
        write_args = (streams,) * 11
    else:
        block_mix, block_write, block_input, block_output, readout = written_by
        write_args = (streams if grad is None else grad, streams if grad_state is None else grad_state, *written_by,
                      torch.empty_like(block_input), torch.empty_like(block_output),
                      torch.empty(positions, blocks, n * n + n, dtype=torch.float32, device=device),
                      torch.empty(SPLITS * blocks, n, dtype=torch.float32, device=device))
    _streams_backward_kernel[(blocks, SPLITS)](
        grad_read, streams, projection, grad_pre, inverse_rms, scalars, grad_streams, w_shares, *write_args, positions,
        n, channels, WRITES=written_by is not None, HAS_GRAD=grad is not None, HAS_STATE=grad_state is not None,
        LOW=tile_products_in_tf32(streams, projection), N=width, K=outputs, BLOCK_P=_tile_positions(width),
        BLOCK_C=STREAMS_BLOCK_C, num_warps=8, num_stages=1)
    static = static_read.dtype  # A_m's, A_r's and B's
    # each gradient its own sum: an operator's outputs never alias one another
    read_grads = (w_shares.sum(0).to(projection.dtype), shares["read"].sum(0).to(static),
                  shares["mix"].sum(0).to(static), shares["write"].sum(0).to(static),
                  shares["scales"][:, 0].sum(0).to(read_mix_scale.dtype),
                  shares["scales"][:, 1].sum(0).to(write_scale.dtype))
    if written_by is None:
        return (grad_streams, *read_grads)
    write_shares = write_args[9]
    grad_block_mix = write_shares[..., :n * n].sum(1).view(positions, n, n).to(block_mix.dtype)
    grad_block_write = write_shares[..., n * n:].sum(1).to(block_write.dtype)
    return (grad_streams, grad_block_mix, grad_block_write, write_args[7], write_args[8],
            write_args[10].sum(0).to(readout.dtype), *read_grads)


def backward(grad_read, grad_mix, grad_write, streams, projection, static_read, read_mix_scale, write_scale, dynamic,
             inverse_rms):
    """The gradients of the streams, W, A_m, A_r, B, s_a and s_b given those of the forward's outputs and its D and
    1/RMS, each in its input's precision."""
    return _backward(grad_read, grad_mix, grad_write, streams, streams, projection, static_read, read_mix_scale,
                     write_scale, dynamic, inverse_rms)


def backward_after_write(grad, grad_state, grad_read, grad_mix, grad_write, streams, written, block_mix, block_write,
                         block_input, block_output, readout, projection, static_read, read_mix_scale, write_scale,
                         dynamic, inverse_rms):
    """:func:`forward_after_write`'s backward: the gradients of H, r, b, h, y, o, W, A_m, A_r, B, s_a and s_b given
    those of H' and the state (None: not used) and of h', r' and b', with the H' the forward stored (``written``) and
    its D and 1/RMS; H''s complete gradient (from above, the state's and the read's) is summed in registers and never
    stored."""
    return _backward(grad_read, grad_mix, grad_write, written, streams, projection, static_read, read_mix_scale,
                     write_scale, dynamic, inverse_rms, (block_mix, block_write, block_input, block_output, readout),
                     grad, grad_state)
