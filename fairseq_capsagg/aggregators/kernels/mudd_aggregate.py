"""A MUDD connection in one Triton kernel each way (:mod:`.mudd_aggregate`).

Per position, with its L layers H^l (C each), depth first: w = W_2 GELU(W_1 RMSNorm(H^L)) + b (S x L) and
Omega_s = sum_l w_{s,l} H^l, in fp32 whatever the layers' precision. Each program holds ``BLOCK_P`` positions and
walks their C channels in chunks of ``BLOCK_C``, every layer at once; L, S and the MLP's width H are padded to
powers of two with zeros. The forward reads the layers twice (the MLP's input, then the sums), the backward three
times (the weights' gradients and the MLP again, RMSNorm's mean, the layers' gradients). The gradients of W_1,
W_2 and b are written as one share per program and summed afterwards, so that no two programs add into the same
memory.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import position_kernel

BLOCK_P = 4
BLOCK_C = 32
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
def _chunk(ptr, p, l, c, live, num_layers, positions, channels):
    """A (P, L, BLOCK_C) chunk of a depth-first (L, P, C) tensor (the layers, or Omega with L = S), fp32."""
    inside = live[:, None, None] & (l[None, :, None] < num_layers) & (c[None, None, :] < channels)
    offsets = l[None, :, None] * positions * channels + p[:, None, None] * channels + c[None, None, :]
    return tl.load(ptr + offsets, mask=inside, other=0.0).to(tl.float32)


@triton.jit
def _newest(layers_ptr, p, c, live, num_layers, positions, channels):
    """H^L's (P, BLOCK_C) chunk, fp32."""
    return tl.load(layers_ptr + (num_layers - 1) * positions * channels + p[:, None] * channels + c[None, :],
                   mask=live[:, None] & (c[None, :] < channels), other=0.0).to(tl.float32)


@triton.jit
def _fc1(fc1_ptr, h, c, hidden, channels):
    return tl.load(fc1_ptr + h[:, None] * channels + c[None, :], mask=(h[:, None] < hidden) & (c[None, :] < channels),
                   other=0.0).to(tl.float32)


@triton.jit
def _mlp_input(layers_ptr, fc1_ptr, p, h, live, num_layers, positions, channels, hidden, eps,
               BLOCK_P: tl.constexpr, HID: tl.constexpr, BLOCK_C: tl.constexpr):
    """1 / RMS(H^L) (P) and W_1 RMSNorm(H^L) (P, H)."""
    total = tl.zeros((BLOCK_P,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_P, HID), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _newest(layers_ptr, p, c, live, num_layers, positions, channels)
        total += tl.sum(x * x, axis=1)
        acc += tl.sum(x[:, None, :] * _fc1(fc1_ptr, h, c, hidden, channels)[None, :, :], axis=2)
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    return inverse_rms, acc * inverse_rms[:, None]


@triton.jit
def _fc2(fc2_ptr, s, l, h, streams, num_layers, hidden):
    """W_2 as (S, L, H)."""
    inside = (s[:, None, None] < streams) & (l[None, :, None] < num_layers) & (h[None, None, :] < hidden)
    return tl.load(fc2_ptr + (s[:, None, None] * num_layers + l[None, :, None]) * hidden + h[None, None, :],
                   mask=inside, other=0.0).to(tl.float32)


@position_kernel
def _forward_kernel(layers_ptr, fc1_ptr, fc2_ptr, static_ptr, out_ptr, num_layers, positions, channels, streams,
                    hidden, eps, L: tl.constexpr, S: tl.constexpr, HID: tl.constexpr, BLOCK_P: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    s = tl.arange(0, S)
    h = tl.arange(0, HID)
    live = p < positions
    _, pre = _mlp_input(layers_ptr, fc1_ptr, p, h, live, num_layers, positions, channels, hidden, eps, BLOCK_P, HID,
                        BLOCK_C)
    activation = _gelu(pre)
    fc2 = _fc2(fc2_ptr, s, l, h, streams, num_layers, hidden)
    sl_live = (s[:, None] < streams) & (l[None, :] < num_layers)
    static = tl.load(static_ptr + s[:, None] * num_layers + l[None, :], mask=sl_live, other=0.0).to(tl.float32)
    weights = tl.sum(activation[:, None, None, :] * fc2[None, :, :, :], axis=3) + static[None, :, :]  # (P, S, L)
    weights = weights.to(out_ptr.dtype.element_ty).to(tl.float32)  # the reference weighs in the layers' dtype
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _chunk(layers_ptr, p, l, c, live, num_layers, positions, channels)  # (P, L, C)
        out = tl.sum(weights[:, :, :, None] * x[:, None, :, :], axis=2)  # (P, S, C)
        inside = live[:, None, None] & (s[None, :, None] < streams) & (c[None, None, :] < channels)
        tl.store(out_ptr + s[None, :, None] * positions * channels + p[:, None, None] * channels + c[None, None, :],
                 out.to(out_ptr.dtype.element_ty), mask=inside)


@position_kernel
def _backward_kernel(grad_ptr, layers_ptr, fc1_ptr, fc2_ptr, static_ptr, grad_layers_ptr, fc1_shares_ptr,
                     fc2_shares_ptr, static_shares_ptr, num_layers, positions, channels, streams, hidden, eps,
                     ACCUMULATE: tl.constexpr, L: tl.constexpr, S: tl.constexpr, HID: tl.constexpr,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    s = tl.arange(0, S)
    h = tl.arange(0, HID)
    live = p < positions
    # pass 1: the weights' gradient grad_w[s, l] = grad_s . H^l
    grad_weights = tl.zeros((BLOCK_P, S, L), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _chunk(layers_ptr, p, l, c, live, num_layers, positions, channels)
        grad = _chunk(grad_ptr, p, s, c, live, streams, positions, channels)  # (P, S, C)
        grad_weights += tl.sum(grad[:, :, None, :] * x[:, None, :, :], axis=3)
    inverse_rms, pre = _mlp_input(layers_ptr, fc1_ptr, p, h, live, num_layers, positions, channels, hidden, eps,
                                  BLOCK_P, HID, BLOCK_C)
    activation = _gelu(pre)
    fc2 = _fc2(fc2_ptr, s, l, h, streams, num_layers, hidden)
    sl_live = (s[:, None] < streams) & (l[None, :] < num_layers)
    static = tl.load(static_ptr + s[:, None] * num_layers + l[None, :], mask=sl_live, other=0.0).to(tl.float32)
    weights = tl.sum(activation[:, None, None, :] * fc2[None, :, :, :], axis=3) + static[None, :, :]
    # this program's shares of b's and W_2's gradients, and the MLP's backward to its pre-activation
    tl.store(static_shares_ptr + program * streams * num_layers + s[:, None] * num_layers + l[None, :],
             tl.sum(grad_weights, axis=0), mask=sl_live)
    grad_fc2 = tl.sum(grad_weights[:, :, :, None] * activation[:, None, None, :], axis=0)  # (S, L, H)
    tl.store(fc2_shares_ptr + program * streams * num_layers * hidden
             + (s[:, None, None] * num_layers + l[None, :, None]) * hidden + h[None, None, :], grad_fc2,
             mask=sl_live[:, :, None] & (h[None, None, :] < hidden))
    grad_activation = tl.sum(tl.sum(grad_weights[:, :, :, None] * fc2[None, :, :, :], axis=1), axis=1)  # (P, H)
    grad_pre = grad_activation * _gelu_derivative(pre)
    # pass 2: RMSNorm's backward needs mean(g * normed) over H^L, g = grad_pre W_1
    projected = tl.zeros((BLOCK_P,), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _newest(layers_ptr, p, c, live, num_layers, positions, channels)
        g = tl.sum(grad_pre[:, :, None] * _fc1(fc1_ptr, h, c, hidden, channels)[None, :, :], axis=1)
        projected += tl.sum(g * x, axis=1)
    projected = projected * inverse_rms / channels
    # pass 3: the layers' gradients (sum_s w_{s,l} grad_s, and RMSNorm's on H^L) and this program's share of W_1's
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _chunk(layers_ptr, p, l, c, live, num_layers, positions, channels)
        grad = _chunk(grad_ptr, p, s, c, live, streams, positions, channels)
        grad_x = tl.sum(weights[:, :, :, None] * grad[:, :, None, :], axis=1)  # (P, L, C)
        newest = _newest(layers_ptr, p, c, live, num_layers, positions, channels)
        g = tl.sum(grad_pre[:, :, None] * _fc1(fc1_ptr, h, c, hidden, channels)[None, :, :], axis=1)
        normed = newest * inverse_rms[:, None]
        grad_norm = inverse_rms[:, None] * (g - normed * projected[:, None])
        grad_x += tl.where(l[None, :, None] == num_layers - 1, grad_norm[:, None, :], 0.0)
        inside = live[:, None, None] & (l[None, :, None] < num_layers) & (c[None, None, :] < channels)
        grad_layers_at = grad_layers_ptr + l[None, :, None] * positions * channels + p[:, None, None] * channels \
            + c[None, None, :]
        if ACCUMULATE:  # added to the gradient already there
            grad_x += tl.load(grad_layers_at, mask=inside, other=0.0).to(tl.float32)
        tl.store(grad_layers_at, grad_x.to(grad_layers_ptr.dtype.element_ty), mask=inside)
        grad_fc1 = tl.sum(grad_pre[:, :, None] * normed[:, None, :], axis=0)  # (H, C)
        tl.store(fc1_shares_ptr + program * hidden * channels + h[:, None] * channels + c[None, :], grad_fc1,
                 mask=(h[:, None] < hidden) & (c[None, :] < channels))


def _meta(positions: int, num_layers: int, streams: int, hidden: int):
    return (dict(L=triton.next_power_of_2(num_layers), S=triton.next_power_of_2(streams),
                 HID=triton.next_power_of_2(hidden), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C),
            (triton.cdiv(positions, BLOCK_P),))


def forward(layers: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, static: torch.Tensor,
            eps: float) -> torch.Tensor:
    """Omega (S, P, C) in the layers' dtype from contiguous layers (L, P, C) and W_1, W_2, b in any precision (read
    in fp32)."""
    num_layers, positions, channels = layers.shape
    streams, hidden = static.size(0), fc1.size(0)
    out = torch.empty(streams, positions, channels, dtype=layers.dtype, device=layers.device)
    meta, grid = _meta(positions, num_layers, streams, hidden)
    _forward_kernel[grid](layers, fc1, fc2, static, out, num_layers, positions, channels, streams, hidden, eps, **meta)
    return out


def backward(grad: torch.Tensor, layers: torch.Tensor, fc1: torch.Tensor, fc2: torch.Tensor, static: torch.Tensor,
             eps: float, grad_layers: Optional[torch.Tensor] = None, accumulate: bool = False):
    """The gradients of the layers, W_1, W_2 and b given ``grad`` of Omega, each in its input's precision; the
    layers' written into ``grad_layers`` where given (contiguous, as the layers), or added to what it holds
    (``accumulate``)."""
    num_layers, positions, channels = layers.shape
    streams, hidden = static.size(0), fc1.size(0)
    meta, grid = _meta(positions, num_layers, streams, hidden)
    grad_layers = torch.empty_like(layers) if grad_layers is None else grad_layers
    shares = [torch.empty(grid[0], *t.shape, dtype=torch.float32, device=layers.device) for t in (fc1, fc2, static)]
    _backward_kernel[grid](grad, layers, fc1, fc2, static, grad_layers, *shares, num_layers, positions, channels,
                           streams, hidden, eps, ACCUMULATE=accumulate, **meta)
    return (grad_layers, *(share.sum(0).to(t.dtype) for share, t in zip(shares, (fc1, fc2, static))))
