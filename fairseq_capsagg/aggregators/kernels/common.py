"""What several Triton kernels share: the decorator of the kernels that take a batch's position count
(:data:`position_kernel`), the tile product of the streams' projections (:func:`tile_dot`), tile loaders (a few
positions' residual streams, read by :mod:`.hyper_read` and :mod:`.mhc_read` through :mod:`.stream_write`; one
position's routing votes, by :mod:`.dynamic_route` and
:mod:`.em_route`), and the routing kernels' launch heuristic (:func:`warps`).

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

#: The decorator of every kernel that takes a batch's position count (``positions``): Triton would specialise that
#: integer (equal to 1, a multiple of 16) and compile the kernel again for each kind of batch; left unspecialised, a
#: kernel compiles once per shape and precision.
position_kernel = triton.jit(do_not_specialize=["positions"])


@triton.jit
def tile_dot(a, b, LOW: tl.constexpr):
    """a @ b of fp32 tiles, accumulated in fp32: in a half-precision model (``LOW``, :func:`tile_products_in_tf32`) on
    the tensor cores in TF32, whose 10-bit mantissa holds bf16 and fp16 values exactly (the streams and the weights
    of a forward; a backward's fp32 gradients are rounded there, below the model's own rounding of them), else in
    exact fp32."""
    if LOW:
        return tl.dot(a, b, input_precision="tf32")
    return tl.dot(a, b, input_precision="ieee")


def tile_products_in_tf32(streams: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`tile_dot` runs on the tensor cores in TF32: in a half-precision model, the streams and the
    weight both bf16 or both fp16."""
    return streams.dtype == weight.dtype and streams.dtype in (torch.bfloat16, torch.float16)


@triton.jit
def stream_chunk(streams_ptr, p, i, c, live, n, channels):
    """Streams (P, n, C), contiguous: the positions p's streams i at channels c as (P, N, BLOCK_C), fp32, zero where
    padded."""
    inside = live[:, None, None] & (i[None, :, None] < n) & (c[None, None, :] < channels)
    offsets = p[:, None, None] * n * channels + i[None, :, None] * channels + c[None, None, :]
    return tl.load(streams_ptr + offsets, mask=inside, other=0.0).to(tl.float32)


@triton.jit
def vote_offsets(position, stride_position, stride_layer, num_layers, capsules, capsule_dim, L: tl.constexpr,
                 N: tl.constexpr, D: tl.constexpr):
    """Votes (P, L, N, D) with each layer's N x D block contiguous and any strides between positions and layers:
    one position's (L, N, D) tile as offsets, with its mask."""
    l = tl.arange(0, L)
    n = tl.arange(0, N)
    h = tl.arange(0, D)
    inside = (l[:, None, None] < num_layers) & (n[None, :, None] < capsules) & (h[None, None, :] < capsule_dim)
    offsets = position * stride_position + l[:, None, None] * stride_layer \
        + n[None, :, None] * capsule_dim + h[None, None, :]
    return offsets, inside


@triton.jit
def position_votes(votes_ptr, position, stride_position, stride_layer, num_layers, capsules, capsule_dim,
                   L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    """One position's votes (:func:`vote_offsets`) as an (L, N, D) fp32 tile, whatever their precision, zero where
    padded, with the tile's mask."""
    offsets, inside = vote_offsets(position, stride_position, stride_layer, num_layers, capsules, capsule_dim, L, N,
                                   D)
    return tl.load(votes_ptr + offsets, mask=inside, other=0.0).to(tl.float32), inside


def warps(tile: int) -> int:
    """Warps for a program that holds ``tile`` values of one position at once (the routing kernels), as the Triton
    tutorials' row softmax: more warps for wider tiles, so that fewer registers spill."""
    return 16 if tile >= 4096 else 8 if tile >= 2048 else 4
