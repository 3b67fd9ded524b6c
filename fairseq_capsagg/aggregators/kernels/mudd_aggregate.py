"""A MUDD connection in Triton kernels (:mod:`..ops.mudd_aggregate`): one forward, two backward.

Per position, with its L layers H^l (C each), depth first: w = W_2 GELU(W_1 RMSNorm(H^L)) + b (S x L) and
Omega_s = sum_l w_{s,l} H^l, in fp32 whatever the layers' precision.

* forward, a program per ``BLOCK_P`` positions: H^L once for its RMS and the MLP's input (``tl.dot`` of the tile's
  positions with W_1's columns, :func:`.common.tile_dot`; W_1 read once a program), the MLP's pre-activation and
  1/RMS stored for the backward; the weights by ``tl.dot`` with W_2; then every layer once for the sums, one layer
  at a time.
* backward, :func:`_weights_backward_kernel`, a program per ``WEIGHTS_BLOCK_P`` positions: the layers and dOmega
  once, for the weights' gradient grad_w[s, l] = dOmega_s . H^l; the MLP's backward to its pre-activation, and
  RMSNorm's mean(g . normed) = sum_h G_h pre_h / C (from the saved pre-activation: no pass over H^L for it), stored
  per position with the weights; the gradients of b and W_2 as one share a program.
* backward, :func:`_layers_backward_kernel`, a program per ``LAYERS_BLOCK_C`` channels and one of ``SPLITS`` ranges of
  positions: W_1's columns once; dOmega and H^L once; every layer's gradient sum_s w_{s,l} dOmega_s (RMSNorm's added
  on H^L), and W_1's accumulated over the range (``tl.dot``), stored once a program (summed over the ranges
  afterwards: deterministic).

L, S and the MLP's width H are padded to powers of two with zeros (S L and H to at least 16, ``tl.dot``'s smallest
tile).

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import position_kernel, tile_dot, tile_products_in_tf32

#: Forward: positions per program (W_1 is read once a program), channels per chunk.
BLOCK_P = 64
BLOCK_C = 32
#: Backward, the weights' gradient: positions per program (W_2's gradient is one share a program), channels per chunk.
WEIGHTS_BLOCK_P = 64
WEIGHTS_BLOCK_C = 32
#: Backward, the layers' and W_1's gradients: positions per tile, channels per program, ranges of positions.
LAYERS_BLOCK_P = 16
LAYERS_BLOCK_C = 64
SPLITS = 32
# constexprs: a jit function reads no other module global (the compiler refuses it; the interpreter does not)
_SQRT_HALF = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)


@triton.jit
def _gelu(x):
    return 0.5 * x * (1.0 + tl.math.erf(x * _SQRT_HALF))


@triton.jit
def _gelu_derivative(x):
    return 0.5 * (1.0 + tl.math.erf(x * _SQRT_HALF)) + x * tl.exp(-0.5 * x * x) * _INV_SQRT_2PI


@triton.jit
def _layer(ptr, index, p, c, live, positions, channels):
    """Layer ``index``'s (P, BLOCK_C) chunk of a depth-first (L, P, C) tensor, fp32."""
    return tl.load(ptr + index * positions * channels + p[:, None] * channels + c[None, :],
                   mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)


@triton.jit
def _fc1(fc1_ptr, h, c, hidden, channels):
    """W_1 (H, BLOCK_C) of chunk c, fp32, zero where padded."""
    return tl.load(fc1_ptr + h[:, None] * channels + c[None, :], mask=(h[:, None] < hidden) & (c[None, :] < channels),
                   other=0.0).to(tl.float32)


@triton.jit
def _fc2(fc2_ptr, s, l, h, streams, num_layers, hidden, S: tl.constexpr, L: tl.constexpr, HID: tl.constexpr):
    """W_2 (S L, H) with its rows at s L + l (the padded layout of the weights), fp32, zero where padded."""
    inside = (s[:, None, None] < streams) & (l[None, :, None] < num_layers) & (h[None, None, :] < hidden)
    w = tl.load(fc2_ptr + (s[:, None, None] * num_layers + l[None, :, None]) * hidden + h[None, None, :],
                mask=inside, other=0.0).to(tl.float32)
    return tl.reshape(w, (S * L, HID))


@triton.jit
def _column(weights, index):
    """weights[:, :, index] of (P, S, L)."""
    return tl.sum(tl.where(tl.arange(0, weights.shape[2])[None, None, :] == index, weights, 0.0), axis=2)


@position_kernel
def _forward_kernel(layers_ptr, fc1_ptr, fc2_ptr, static_ptr, out_ptr, pre_ptr, inverse_rms_ptr, num_layers, positions,
                    channels, streams, hidden, eps, LOW: tl.constexpr, L: tl.constexpr, S: tl.constexpr,
                    HID: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    s = tl.arange(0, S)
    h = tl.arange(0, HID)
    live = p < positions
    # the MLP's input: H^L's RMS and W_1 H^L
    total = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, HID), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _layer(layers_ptr, num_layers - 1, p, c, live, positions, channels)
        total += tl.sum(x * x, axis=1)
        acc += tile_dot(x, tl.trans(_fc1(fc1_ptr, h, c, hidden, channels)), LOW)
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    pre = acc * inverse_rms[:, None]
    tl.store(pre_ptr + p[:, None] * hidden + h[None, :], pre, mask=live[:, None] & (h[None, :] < hidden))
    tl.store(inverse_rms_ptr + p, inverse_rms, mask=live)
    mlp = tile_dot(_gelu(pre), tl.trans(_fc2(fc2_ptr, s, l, h, streams, num_layers, hidden, S, L, HID)), LOW)
    sl_live = (s[:, None] < streams) & (l[None, :] < num_layers)
    static = tl.load(static_ptr + s[:, None] * num_layers + l[None, :], mask=sl_live, other=0.0).to(tl.float32)
    weights = tl.reshape(mlp, (BLOCK_P, S, L)) + static[None, :, :]
    weights = weights.to(out_ptr.dtype.element_ty).to(tl.float32)  # the reference weighs in the layers' dtype
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        out = tl.zeros((BLOCK_P, S, BLOCK_C), dtype=tl.float32)
        for index in tl.static_range(L):
            if index < num_layers:
                x = _layer(layers_ptr, index, p, c, live, positions, channels)
                out += _column(weights, index)[:, :, None] * x[:, None, :]
        inside = live[:, None, None] & (s[None, :, None] < streams) & (c[None, None, :] < channels)
        tl.store(out_ptr + s[None, :, None] * positions * channels + p[:, None, None] * channels + c[None, None, :],
                 out.to(out_ptr.dtype.element_ty), mask=inside)


@position_kernel
def _weights_backward_kernel(grad_ptr, layers_ptr, fc2_ptr, static_ptr, pre_ptr, weights_ptr, grad_pre_ptr,
                             mean_ptr, fc2_shares_ptr, static_shares_ptr, num_layers, positions, channels, streams,
                             hidden, LOW: tl.constexpr, L: tl.constexpr, S: tl.constexpr, HID: tl.constexpr,
                             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per position: the weights w (P, S, L), the MLP's gradient before GELU (P, H) and RMSNorm's mean(g . normed)
    (P); this program's shares of the gradients of W_2 and b."""
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    s = tl.arange(0, S)
    h = tl.arange(0, HID)
    live = p < positions
    # the weights' gradient grad_w[s, l] = dOmega_s . H^l, one layer at a time
    grad_weights = tl.zeros((BLOCK_P, S, L), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        inside = live[:, None, None] & (s[None, :, None] < streams) & (c[None, None, :] < channels)
        grad = tl.load(grad_ptr + s[None, :, None] * positions * channels + p[:, None, None] * channels
                       + c[None, None, :], mask=inside, other=0.0).to(tl.float32)  # (P, S, C)
        for index in tl.static_range(L):
            if index < num_layers:
                x = _layer(layers_ptr, index, p, c, live, positions, channels)
                grad_weights += tl.where(l[None, None, :] == index, tl.sum(grad * x[:, None, :], axis=2)[:, :, None],
                                         0.0)
    ph_live = live[:, None] & (h[None, :] < hidden)
    pre = tl.load(pre_ptr + p[:, None] * hidden + h[None, :], mask=ph_live, other=0.0)
    activation = _gelu(pre)
    fc2 = _fc2(fc2_ptr, s, l, h, streams, num_layers, hidden, S, L, HID)  # (S L, H)
    sl_live = (s[:, None] < streams) & (l[None, :] < num_layers)
    static = tl.load(static_ptr + s[:, None] * num_layers + l[None, :], mask=sl_live, other=0.0).to(tl.float32)
    weights = tl.reshape(tile_dot(activation, tl.trans(fc2), LOW), (BLOCK_P, S, L)) + static[None, :, :]
    psl_live = live[:, None, None] & sl_live[None, :, :]
    tl.store(weights_ptr + (p[:, None, None] * streams + s[None, :, None]) * num_layers + l[None, None, :], weights,
             mask=psl_live)
    # this program's shares of b's and W_2's gradients, and the MLP's backward to its pre-activation
    tl.store(static_shares_ptr + program * streams * num_layers + s[:, None] * num_layers + l[None, :],
             tl.sum(grad_weights, axis=0), mask=sl_live)
    flat = tl.reshape(grad_weights, (BLOCK_P, S * L))
    grad_fc2 = tl.reshape(tile_dot(tl.trans(flat), activation, LOW), (S, L, HID))
    tl.store(fc2_shares_ptr + program * streams * num_layers * hidden
             + (s[:, None, None] * num_layers + l[None, :, None]) * hidden + h[None, None, :], grad_fc2,
             mask=sl_live[:, :, None] & (h[None, None, :] < hidden))
    grad_pre = tile_dot(flat, fc2, LOW) * _gelu_derivative(pre)
    tl.store(grad_pre_ptr + p[:, None] * hidden + h[None, :], grad_pre, mask=ph_live)
    # RMSNorm's backward needs mean(g . normed) over H^L, g = G W_1: sum_h G_h pre_h / C
    tl.store(mean_ptr + p, tl.sum(tl.where(ph_live, grad_pre * pre, 0.0), axis=1) / channels, mask=live)


@position_kernel
def _layers_backward_kernel(grad_ptr, layers_ptr, fc1_ptr, weights_ptr, grad_pre_ptr, inverse_rms_ptr, mean_ptr,
                            grad_layers_ptr, fc1_shares_ptr, num_layers, positions, channels, streams, hidden,
                            ACCUMULATE: tl.constexpr, LOW: tl.constexpr, L: tl.constexpr, S: tl.constexpr,
                            HID: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """Channels c over one range of positions: every layer's gradient (added to what grad_layers holds with
    ACCUMULATE) and this range's share of W_1's gradient at c."""
    block = tl.program_id(0)
    split = tl.program_id(1)
    c = block * BLOCK_C + tl.arange(0, BLOCK_C)
    s = tl.arange(0, S)
    h = tl.arange(0, HID)
    fc1 = _fc1(fc1_ptr, h, c, hidden, channels)  # (H, BLOCK_C), once
    grad_fc1 = tl.zeros((HID, BLOCK_C), dtype=tl.float32)
    tiles = tl.cdiv(tl.cdiv(positions, BLOCK_P), tl.num_programs(1))
    for tile in range(split * tiles, (split + 1) * tiles):
        p = tile * BLOCK_P + tl.arange(0, BLOCK_P)
        live = p < positions
        pc_live = live[:, None] & (c[None, :] < channels)
        grad_pre = tl.load(grad_pre_ptr + p[:, None] * hidden + h[None, :], mask=live[:, None] & (h[None, :] < hidden),
                           other=0.0)
        inverse_rms = tl.load(inverse_rms_ptr + p, mask=live, other=0.0)
        mean = tl.load(mean_ptr + p, mask=live, other=0.0)
        inside = live[:, None, None] & (s[None, :, None] < streams) & (c[None, None, :] < channels)
        grad = tl.load(grad_ptr + s[None, :, None] * positions * channels + p[:, None, None] * channels
                       + c[None, None, :], mask=inside, other=0.0).to(tl.float32)  # (P, S, C)
        normed = _layer(layers_ptr, num_layers - 1, p, c, live, positions, channels) * inverse_rms[:, None]
        grad_norm = inverse_rms[:, None] * (tile_dot(grad_pre, fc1, LOW) - normed * mean[:, None])
        grad_fc1 += tile_dot(tl.trans(grad_pre), normed, LOW)
        for index in tl.static_range(L):
            if index < num_layers:
                w = tl.load(weights_ptr + (p[:, None] * streams + s[None, :]) * num_layers + index,
                            mask=live[:, None] & (s[None, :] < streams), other=0.0)  # (P, S)
                grad_x = tl.sum(w[:, :, None] * grad, axis=1)
                if index == num_layers - 1:
                    grad_x += grad_norm
                at = grad_layers_ptr + index * positions * channels + p[:, None] * channels + c[None, :]
                if ACCUMULATE:  # added to the gradient already there
                    grad_x += tl.load(at, mask=pc_live, other=0.0).to(tl.float32)
                tl.store(at, grad_x.to(grad_layers_ptr.dtype.element_ty), mask=pc_live)
    tl.store(fc1_shares_ptr + split * hidden * channels + h[:, None] * channels + c[None, :], grad_fc1,
             mask=(h[:, None] < hidden) & (c[None, :] < channels))


def _meta(num_layers: int, streams: int, hidden: int):
    """L, S and H padded: S L and H to at least 16."""
    layers = triton.next_power_of_2(num_layers)
    return dict(L=layers, S=max(triton.next_power_of_2(streams), triton.cdiv(16, layers)),
                HID=max(16, triton.next_power_of_2(hidden)))


def forward(layers: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, static: torch.Tensor, eps: float):
    """Omega (S, P, C) in the layers' dtype from contiguous layers (L, P, C) and W_1, W_2, b in any precision (read
    in fp32); then, for the backward, the MLP's pre-activation (P, H) and 1/RMS(H^L) (P), fp32."""
    num_layers, positions, channels = layers.shape
    streams, hidden = static.size(0), fc1.size(0)
    out = torch.empty(streams, positions, channels, dtype=layers.dtype, device=layers.device)
    pre = torch.empty(positions, hidden, dtype=torch.float32, device=layers.device)
    inverse_rms = torch.empty(positions, dtype=torch.float32, device=layers.device)
    _forward_kernel[(triton.cdiv(positions, BLOCK_P),)](
        layers, fc1, fc2, static, out, pre, inverse_rms, num_layers, positions, channels, streams, hidden, eps,
        LOW=tile_products_in_tf32(layers, fc1), **_meta(num_layers, streams, hidden), BLOCK_P=BLOCK_P,
        BLOCK_C=BLOCK_C, num_warps=8)
    return out, pre, inverse_rms


def backward(grad: torch.Tensor, layers: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, static: torch.Tensor,
             pre: torch.Tensor, inverse_rms: torch.Tensor, grad_layers: Optional[torch.Tensor] = None,
             accumulate: bool = False):
    """The gradients of the layers, W_1, W_2 and b given ``grad`` of Omega and the forward's pre-activation and 1/RMS,
    each in its input's precision; the layers' written into ``grad_layers`` where given (contiguous, as the layers),
    or added to what it holds (``accumulate``)."""
    num_layers, positions, channels = layers.shape
    streams, hidden = static.size(0), fc1.size(0)
    device = layers.device
    meta = _meta(num_layers, streams, hidden)
    low = tile_products_in_tf32(layers, fc1)
    programs = triton.cdiv(positions, WEIGHTS_BLOCK_P)
    weights = torch.empty(positions, streams, num_layers, dtype=torch.float32, device=device)
    grad_pre = torch.empty(positions, hidden, dtype=torch.float32, device=device)
    mean = torch.empty(positions, dtype=torch.float32, device=device)
    fc2_shares = torch.empty(programs, *fc2.shape, dtype=torch.float32, device=device)
    static_shares = torch.empty(programs, *static.shape, dtype=torch.float32, device=device)
    _weights_backward_kernel[(programs,)](
        grad, layers, fc2, static, pre, weights, grad_pre, mean, fc2_shares, static_shares, num_layers, positions,
        channels, streams, hidden, LOW=low, **meta, BLOCK_P=WEIGHTS_BLOCK_P, BLOCK_C=WEIGHTS_BLOCK_C, num_warps=8)
    grad_layers = torch.empty_like(layers) if grad_layers is None else grad_layers
    fc1_shares = torch.empty(SPLITS, *fc1.shape, dtype=torch.float32, device=device)
    _layers_backward_kernel[(triton.cdiv(channels, LAYERS_BLOCK_C), SPLITS)](
        grad, layers, fc1, weights, grad_pre, inverse_rms, mean, grad_layers, fc1_shares, num_layers, positions,
        channels, streams, hidden, ACCUMULATE=accumulate, LOW=low, **meta, BLOCK_P=LAYERS_BLOCK_P,
        BLOCK_C=LAYERS_BLOCK_C, num_warps=8)
    return (grad_layers, fc1_shares.sum(0).to(fc1.dtype), fc2_shares.sum(0).to(fc2.dtype),
            static_shares.sum(0).to(static.dtype))
