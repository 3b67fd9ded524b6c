"""The residual streams' write and the stack's state after it in one Triton kernel each way (hyper-connections, mHC;
:mod:`.stream_write`).

Per position, with the n streams H (n x C), the mix r (n x n: stream i into stream j), the write b (n), the
block's input h and output y (C): H'_j = b_j y + (sum_i r_ij H_i - b_j h), in that order (the reference's: at
the identity start the streams stay exact copies), and the state sum_j o_j H'_j of the stored H', in fp32 whatever
the tensors' precision. Each program holds ``BLOCK_P`` positions and walks their C channels in chunks of
``BLOCK_C``; the backward loads each chunk's inputs once, recomputes H' from them for the readout's gradient, and
accumulates the per-position reductions over C (the gradients of r and b) in registers across the chunks, so no
position is split between programs, and writes its share of the readout's gradient (summed afterwards). n is padded
to the next power of two with zeros. The read kernels that run the write first between two blocks
(:mod:`.hyper_read`, :mod:`.mhc_read`) use its parts: the write's weights and inputs, H' per chunk, its store, the
state's gradient and the write's backward per chunk.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .common import position_kernel, stream_chunk

BLOCK_P = 8
BLOCK_C = 64


@triton.jit
def write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n):
    """r (P, N_i, N_j), b (P, N_j) and the readout o (N) in fp32, zero where padded."""
    pi_live = live[:, None] & (i[None, :] < n)
    mix = tl.load(mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :],
                  mask=pi_live[:, :, None] & (i[None, None, :] < n), other=0.0).to(tl.float32)
    write = tl.load(write_ptr + p[:, None] * n + i[None, :], mask=pi_live, other=0.0).to(tl.float32)
    readout = tl.load(readout_ptr + i, mask=i < n, other=0.0).to(tl.float32)
    return mix, write, readout


@triton.jit
def write_inputs(streams_ptr, input_ptr, output_ptr, p, i, c, live, n, channels):
    """The write's inputs of chunk c in fp32, zero where padded: H (P, N_i, BLOCK_C), h and y (P, BLOCK_C)."""
    pc_live = live[:, None] & (c[None, :] < channels)
    inside = pc_live[:, None, :] & (i[None, :, None] < n)
    block_input = tl.load(input_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
    block_output = tl.load(output_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
    streams = tl.load(streams_ptr + p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :],
                      mask=inside, other=0.0).to(tl.float32)
    return streams, block_input, block_output


@triton.jit
def _slice(x, index, AXIS: tl.constexpr):
    """Entry ``index`` of a 3-d tile x along AXIS (1 or 2), that dimension dropped: a static index into a tile."""
    if AXIS == 1:
        picked = tl.sum(tl.where(tl.arange(0, x.shape[1])[None, :, None] == index, x, 0.0), axis=1)
    else:
        picked = tl.sum(tl.where(tl.arange(0, x.shape[2])[None, None, :] == index, x, 0.0), axis=2)
    return picked


@triton.jit
def mixed_streams(mix, streams, N: tl.constexpr):
    """sum_i r_ij H_i (P, N_j, BLOCK_C) from r (P, N_i, N_j) and H (P, N_i, BLOCK_C), one stream i at a time (no
    (P, N, N, BLOCK_C) product held at once)."""
    out = tl.zeros(streams.shape, dtype=tl.float32)
    for i in tl.static_range(N):
        out += _slice(mix, i, 1)[:, :, None] * _slice(streams, i, 1)[:, None, :]
    return out


@triton.jit
def written_from(streams, block_input, block_output, mix, write, like_ptr, N: tl.constexpr):
    """H' (P, N_j, BLOCK_C) from the write's inputs (:func:`write_inputs`) as stored (rounded to ``like_ptr``'s dtype),
    in fp32: b_j y + (sum_i r_ij H_i - b_j h), in the reference's order."""
    kept = mixed_streams(mix, streams, N) - write[:, :, None] * block_input[:, None, :]
    return (write[:, :, None] * block_output[:, None, :] + kept).to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def written(streams_ptr, input_ptr, output_ptr, mix, write, p, i, c, live, n, channels, like_ptr):
    """H' (P, N_j, BLOCK_C) of chunk c as stored, in fp32 (:func:`written_from` of the loaded inputs)."""
    streams, block_input, block_output = write_inputs(streams_ptr, input_ptr, output_ptr, p, i, c, live, n, channels)
    return written_from(streams, block_input, block_output, mix, write, like_ptr, streams.shape[1])


@triton.jit
def read_chunk(streams_ptr, block_mix, block_write, input_ptr, output_ptr, p, i, c, live, n, channels,
               like_ptr, WRITES: tl.constexpr):
    """What a connection's read reads of the streams, chunk c (P, N, BLOCK_C) in fp32: the streams (P, n, C) loaded,
    or where the read follows the block's write in one kernel, H' as :func:`written` computes it from the streams
    before the write, the block's r and b (``block_mix``, ``block_write``), its input h and output y."""
    if WRITES:
        x = written(streams_ptr, input_ptr, output_ptr, block_mix, block_write, p, i, c, live, n, channels, like_ptr)
    else:
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
    return x


@triton.jit
def store_written(out_ptr, state_ptr, out, readout, p, i, c, live, n, channels):
    """Stores chunk c of H' (``out``, as :func:`written` returns it) and of the state sum_j o_j H'_j."""
    pc_live = live[:, None] & (c[None, :] < channels)
    tl.store(out_ptr + p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :],
             out.to(out_ptr.dtype.element_ty), mask=pc_live[:, None, :] & (i[None, :, None] < n))
    tl.store(state_ptr + p[:, None] * channels + c[None, :],
             tl.sum(readout[None, :, None] * out, axis=1).to(state_ptr.dtype.element_ty), mask=pc_live)


@triton.jit
def add_state_gradient(grad, grad_state_ptr, readout, out, grad_readout, p, c, live, channels):
    """dH'_j of chunk c with the state's share o_j dS added (``out``: H' as stored), and the readout's gradient
    sum_c dS H'_j accumulated."""
    grad_state = tl.load(grad_state_ptr + p[:, None] * channels + c[None, :],
                         mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)
    return (grad + readout[None, :, None] * grad_state[:, None, :],
            grad_readout + tl.sum(tl.sum(grad_state[:, None, :] * out, axis=2), axis=0))


@triton.jit
def write_backward_from(grad, streams, block_input, block_output, mix, write, grad_streams_ptr, grad_input_ptr,
                        grad_output_ptr, grad_mix, grad_write, p, i, c, live, n, channels):
    """The write's backward on chunk c from dH'_j (P, N_j, BLOCK_C) and the write's inputs (:func:`write_inputs`),
    fp32: stores dH_i = sum_j r_ij dH'_j, dy = sum_j b_j dH'_j and dh = -dy, and returns
    dr_ij += sum_c H_ic dH'_jc and db_j += sum_c (y - h)_c dH'_jc."""
    pc_live = live[:, None] & (c[None, :] < channels)
    inside = pc_live[:, None, :] & (i[None, :, None] < n)
    offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
    # dH_i = sum_j r_ij dH'_j and dr_ij = sum_c H_ic dH'_jc, one new stream j at a time
    grad_streams = tl.zeros(grad.shape, dtype=tl.float32)
    j = tl.arange(0, grad.shape[1])
    for index in tl.static_range(grad.shape[1]):
        grad_j = _slice(grad, index, 1)
        grad_streams += _slice(mix, index, 2)[:, :, None] * grad_j[:, None, :]
        grad_mix += tl.where(j[None, None, :] == index, tl.sum(streams * grad_j[:, None, :], axis=2)[:, :, None], 0.0)
    tl.store(grad_streams_ptr + offsets, grad_streams.to(grad_streams_ptr.dtype.element_ty), mask=inside)
    grad_increment = tl.sum(write[:, :, None] * grad, axis=1)
    tl.store(grad_output_ptr + p[:, None] * channels + c[None, :],
             grad_increment.to(grad_output_ptr.dtype.element_ty), mask=pc_live)
    tl.store(grad_input_ptr + p[:, None] * channels + c[None, :],
             (-grad_increment).to(grad_input_ptr.dtype.element_ty), mask=pc_live)
    increment = block_output - block_input
    return grad_mix, grad_write + tl.sum(grad * increment[:, None, :], axis=2)


@triton.jit
def streams_tile(streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, readout_ptr, like_ptr, p, i, c, live, n,
                 channels, WRITES: tl.constexpr, N: tl.constexpr):
    """For a channel-blocked read backward: the tile of the streams the read read (P, N, BLOCK_C), fp32, loaded, or
    with ``WRITES`` computed from the write's inputs as the write stored it; then the write's r, b, o and inputs H, h,
    y for its backward (:func:`streams_gradient`; without a write, the tile in their place, never read)."""
    if WRITES:
        mix, write, readout = write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n)
        streams, block_input, block_output = write_inputs(streams_ptr, input_ptr, output_ptr, p, i, c, live, n,
                                                          channels)
        x = written_from(streams, block_input, block_output, mix, write, like_ptr, N)
    else:
        x = stream_chunk(streams_ptr, p, i, c, live, n, channels)
        mix, write, readout, streams, block_input, block_output = x, x, x, x, x, x
    return x, mix, write, readout, streams, block_input, block_output


@triton.jit
def streams_gradient(grad_x, x, mix, write, readout, streams, block_input, block_output, grad_ptr, grad_state_ptr,
                     grad_streams_ptr, grad_input_ptr, grad_output_ptr, write_shares_ptr, grad_readout, p, i, c,
                     live, n, channels, block, blocks, WRITES: tl.constexpr, HAS_GRAD: tl.constexpr,
                     HAS_STATE: tl.constexpr, BLOCK_P: tl.constexpr, N: tl.constexpr):
    """A channel-blocked read backward's last step on its tile (:func:`streams_tile`'s): the read's gradient of the
    streams (``grad_x``) stored, or with ``WRITES`` H''s gradient from above (``HAS_GRAD``) and the state's
    (``HAS_STATE``) added, the write's backward run on the sum, and its sums over the block's channels (r's n n, then
    b's n) stored as the block's share of each position's (P, blocks, n n + n); returns the readout's gradient
    accumulated."""
    pc_live = live[:, None] & (c[None, :] < channels)
    inside = pc_live[:, None, :] & (i[None, :, None] < n)
    offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
    if WRITES:
        if HAS_GRAD:
            grad_x += tl.load(grad_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        if HAS_STATE:
            grad_x, grad_readout = add_state_gradient(grad_x, grad_state_ptr, readout, x, grad_readout, p, c, live,
                                                      channels)
        grad_mix, grad_write = write_backward_from(
            grad_x, streams, block_input, block_output, mix, write, grad_streams_ptr, grad_input_ptr,
            grad_output_ptr, tl.zeros((BLOCK_P, N, N), dtype=tl.float32), tl.zeros((BLOCK_P, N), dtype=tl.float32), p,
            i, c, live, n, channels)
        share = write_shares_ptr + (p[:, None] * blocks + block) * (n * n + n)
        pi_live = live[:, None] & (i[None, :] < n)
        tl.store(share[:, :, None] + i[None, :, None] * n + i[None, None, :], grad_mix,
                 mask=pi_live[:, :, None] & (i[None, None, :] < n))
        tl.store(share + n * n + i[None, :], grad_write, mask=pi_live)
    else:
        tl.store(grad_streams_ptr + offsets, grad_x.to(grad_streams_ptr.dtype.element_ty), mask=inside)
    return grad_readout


@triton.jit
def store_write_gradients(grad_mix_ptr, grad_write_ptr, readout_shares_ptr, grad_mix, grad_write, grad_readout,
                          program, p, i, live, n):
    """Stores dr, db and this program's share of the readout's gradient."""
    pi_live = live[:, None] & (i[None, :] < n)
    tl.store(grad_mix_ptr + p[:, None, None] * n * n + i[None, :, None] * n + i[None, None, :],
             grad_mix.to(grad_mix_ptr.dtype.element_ty), mask=pi_live[:, :, None] & (i[None, None, :] < n))
    tl.store(grad_write_ptr + p[:, None] * n + i[None, :], grad_write.to(grad_write_ptr.dtype.element_ty),
             mask=pi_live)
    tl.store(readout_shares_ptr + program * n + i, grad_readout, mask=i < n)


@triton.jit
def block_write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n, BLOCK_P: tl.constexpr, N: tl.constexpr,
                        WRITES: tl.constexpr):
    """For a read kernel: the block's r, b and the readout (:func:`write_weights`) where the read follows the block's
    write, zeros (never read) otherwise."""
    mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    readout = tl.zeros((N,), dtype=tl.float32)
    if WRITES:
        mix, write, readout = write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n)
    return mix, write, readout


@position_kernel
def _forward_kernel(streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, readout_ptr, out_ptr, state_ptr,
                    positions, n, channels, N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    mix, write, readout = write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        out = written(streams_ptr, input_ptr, output_ptr, mix, write, p, i, c, live, n, channels,
                      out_ptr)
        store_written(out_ptr, state_ptr, out, readout, p, i, c, live, n, channels)


@position_kernel
def _backward_kernel(grad_ptr, grad_state_ptr, streams_ptr, mix_ptr, write_ptr, input_ptr, output_ptr, readout_ptr,
                     grad_streams_ptr, grad_mix_ptr, grad_write_ptr, grad_input_ptr, grad_output_ptr,
                     readout_shares_ptr, positions, n, channels, HAS_GRAD: tl.constexpr, HAS_STATE: tl.constexpr,
                     N: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    live = p < positions
    mix, write, readout = write_weights(mix_ptr, write_ptr, readout_ptr, p, i, live, n)
    grad_mix = tl.zeros((BLOCK_P, N, N), dtype=tl.float32)
    grad_write = tl.zeros((BLOCK_P, N), dtype=tl.float32)
    grad_readout = tl.zeros((N,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        # dH'_j (P, N_j, C): its own gradient and the state's, o_j dS (either may be absent: an unused output)
        grad = tl.zeros((BLOCK_P, N, BLOCK_C), dtype=tl.float32)
        if HAS_GRAD:
            grad += tl.load(grad_ptr + p[:, None, None] * n * channels + i[None, :, None] * channels
                            + c[None, None, :], mask=live[:, None, None] & (i[None, :, None] < n)
                            & (c[None, None, :] < channels), other=0.0).to(tl.float32)
        streams, block_input, block_output = write_inputs(streams_ptr, input_ptr, output_ptr, p, i, c, live, n,
                                                          channels)
        if HAS_STATE:
            out = written_from(streams, block_input, block_output, mix, write, grad_streams_ptr, N)  # H' as stored
            grad, grad_readout = add_state_gradient(grad, grad_state_ptr, readout, out, grad_readout, p, c, live,
                                                    channels)
        grad_mix, grad_write = write_backward_from(grad, streams, block_input, block_output, mix, write,
                                                   grad_streams_ptr, grad_input_ptr, grad_output_ptr, grad_mix,
                                                   grad_write, p, i, c, live, n, channels)
    store_write_gradients(grad_mix_ptr, grad_write_ptr, readout_shares_ptr, grad_mix, grad_write, grad_readout,
                          program, p, i, live, n)


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
                           BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C, num_warps=8)
    return grad_streams, grad_mix, grad_write, grad_input, grad_output, shares.sum(0).to(readout.dtype)


#: A write's r, b, h, y and o, for a read kernel that computes the streams it reads as the write would.
WrittenBy = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def write_outputs(streams: torch.Tensor, written_by: Optional[WrittenBy]) -> Tuple[torch.Tensor, ...]:
    """A read kernel's write arguments forward: r, b, h, y and o, then H' and the state to store (fresh), or without
    a write the streams in their place (never read)."""
    if written_by is None:
        return (streams,) * 7
    return (*written_by, torch.empty_like(streams), torch.empty_like(written_by[2]))
