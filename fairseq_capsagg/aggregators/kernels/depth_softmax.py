"""Attention over depth's aggregate in one Triton kernel each way (:mod:`..ops.depth_softmax`).

Per position, with its L layers H^l (C each): s_l = (q . H^l) / RMS(H^l), alpha = softmax_l(s),
w = g alpha + (1 - g) e_L and H~ = sum_l w_l H^l, in fp32 whatever the layers' precision.

* The forward reads the stack once: a program holds ``FORWARD_BLOCK_P`` positions' whole rows (C padded to a power
  of two), one layer at a time, and sums them under an online softmax over depth (the running maximum and
  denominator rescale the running sum, as flash attention's softmax over keys), the newest layer kept for the
  gate's share; the weights are never formed, so the sum is rounded once, at the end.
* The backward reads it twice: a program holds ``BLOCK_P`` positions and walks their C channels in chunks of
  ``BLOCK_C``, every layer at once (L padded to a power of two): the scores and the weights' gradients (a reduction
  over the channels of every layer, which the softmax's backward needs whole), then the layers' and the query's.
  A static query's gradient and the gate's are written as one share per program and summed afterwards, so that no
  two programs add into the same memory.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import position_kernel

#: The forward's positions per program (their rows held whole: FORWARD_BLOCK_P x C values at once).
FORWARD_BLOCK_P = 8
#: The backward's positions per program and channels per chunk.
BLOCK_P = 8
BLOCK_C = 64


@triton.jit
def _layers(layers_ptr, l, p, c, live, num_layers, positions, channels):
    """The layers (L, P, BLOCK_C) of chunk c, fp32, zero where padded."""
    inside = (l[:, None, None] < num_layers) & live[None, :, None] & (c[None, None, :] < channels)
    offsets = l[:, None, None] * positions * channels + p[None, :, None] * channels + c[None, None, :]
    return tl.load(layers_ptr + offsets, mask=inside, other=0.0).to(tl.float32)


@triton.jit
def _query(query_ptr, p, c, live, channels, query_stride):
    """The query (P, BLOCK_C): one row per position, or the same row for all (``query_stride`` 0)."""
    return tl.load(query_ptr + p[:, None] * query_stride + c[None, :], mask=live[:, None] & (c[None, :] < channels),
                   other=0.0).to(tl.float32)


@triton.jit
def _softmax_over_depth(scores, l, num_layers):
    scores = tl.where(l[:, None] < num_layers, scores, float("-inf"))
    exps = tl.exp(scores - tl.max(scores, axis=0)[None, :])
    return exps / tl.sum(exps, axis=0)[None, :]


@position_kernel
def _forward_kernel(layers_ptr, query_ptr, gate_ptr, out_ptr, num_layers, positions, channels, query_stride, eps,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    c = tl.arange(0, BLOCK_C)
    live = p < positions
    pc_live = live[:, None] & (c[None, :] < channels)
    q = _query(query_ptr, p, c, live, channels, query_stride)
    # the running maximum of the scores, the softmax's denominator and the sum, all rescaled to that maximum
    peak = tl.full((BLOCK_P,), float("-inf"), dtype=tl.float32)
    denominator = tl.zeros((BLOCK_P,), dtype=tl.float32)
    total = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    newest = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for layer in range(0, num_layers):
        x = tl.load(layers_ptr + layer * positions * channels + p[:, None] * channels + c[None, :], mask=pc_live,
                    other=0.0).to(tl.float32)
        score = tl.sum(x * q, axis=1) / tl.sqrt(tl.sum(x * x, axis=1) / channels + eps)
        new_peak = tl.maximum(peak, score)
        rescale = tl.exp(peak - new_peak)
        weight = tl.exp(score - new_peak)
        denominator = denominator * rescale + weight
        total = total * rescale[:, None] + weight[:, None] * x
        peak = new_peak
        newest = x
    gate = tl.load(gate_ptr).to(tl.float32)
    out = gate * (total / denominator[:, None]) + (1.0 - gate) * newest
    tl.store(out_ptr + p[:, None] * channels + c[None, :], out.to(out_ptr.dtype.element_ty), mask=pc_live)


@position_kernel
def _backward_kernel(grad_ptr, layers_ptr, query_ptr, gate_ptr, grad_layers_ptr, grad_query_ptr, gate_shares_ptr,
                     num_layers, positions, channels, query_stride, eps, STATIC: tl.constexpr, ACCUMULATE: tl.constexpr,
                     L: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    live = p < positions
    total = tl.zeros((L, BLOCK_P), dtype=tl.float32)
    dots = tl.zeros((L, BLOCK_P), dtype=tl.float32)
    grad_weights = tl.zeros((L, BLOCK_P), dtype=tl.float32)  # grad . H^l
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        x = _layers(layers_ptr, l, p, c, live, num_layers, positions, channels)
        q = _query(query_ptr, p, c, live, channels, query_stride)
        grad = tl.load(grad_ptr + p[:, None] * channels + c[None, :], mask=live[:, None] & (c[None, :] < channels),
                       other=0.0).to(tl.float32)
        total += tl.sum(x * x, axis=2)
        dots += tl.sum(x * q[None, :, :], axis=2)
        grad_weights += tl.sum(x * grad[None, :, :], axis=2)
    inverse_rms = 1.0 / tl.sqrt(total / channels + eps)
    attention = _softmax_over_depth(dots * inverse_rms, l, num_layers)
    gate = tl.load(gate_ptr).to(tl.float32)
    newest = tl.where(l[:, None] == num_layers - 1, 1.0, 0.0)
    weights = gate * attention + (1.0 - gate) * newest
    tl.store(gate_shares_ptr + program, tl.sum(tl.sum(grad_weights * (attention - newest), axis=1), axis=0))
    grad_attention = gate * grad_weights
    grad_scores = attention * (grad_attention - tl.sum(attention * grad_attention, axis=0)[None, :])
    grad_dots = grad_scores * inverse_rms
    # d r / d H^l = -r^3 H^l / C
    grad_norm = grad_scores * dots * inverse_rms * inverse_rms * inverse_rms / channels
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        pc_live = live[:, None] & (c[None, :] < channels)
        x = _layers(layers_ptr, l, p, c, live, num_layers, positions, channels)
        q = _query(query_ptr, p, c, live, channels, query_stride)
        grad = tl.load(grad_ptr + p[:, None] * channels + c[None, :], mask=pc_live, other=0.0).to(tl.float32)
        grad_x = (weights[:, :, None] * grad[None, :, :] + grad_dots[:, :, None] * q[None, :, :]
                  - grad_norm[:, :, None] * x)
        inside = (l[:, None, None] < num_layers) & pc_live[None, :, :]
        grad_layers_at = grad_layers_ptr + l[:, None, None] * positions * channels + p[None, :, None] * channels \
            + c[None, None, :]
        if ACCUMULATE:  # added to the gradient already there
            grad_x += tl.load(grad_layers_at, mask=inside, other=0.0).to(tl.float32)
        tl.store(grad_layers_at, grad_x.to(grad_layers_ptr.dtype.element_ty), mask=inside)
        grad_q = tl.sum(grad_dots[:, :, None] * x, axis=0)  # (P, BLOCK_C)
        if STATIC:  # this program's share of the static query's gradient
            tl.store(grad_query_ptr + program * channels + c, tl.sum(grad_q, axis=0), mask=c < channels)
        else:
            tl.store(grad_query_ptr + p[:, None] * channels + c[None, :], grad_q.to(grad_query_ptr.dtype.element_ty),
                     mask=pc_live)


def _meta(positions: int, num_layers: int):
    return (triton.cdiv(positions, BLOCK_P),), triton.next_power_of_2(num_layers)


def forward(layers: torch.Tensor, query: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """H~ (P, C) in the layers' dtype from contiguous layers (L, P, C), a query (C) or (P, C) and g, the query and g
    in any precision (read in fp32)."""
    num_layers, positions, channels = layers.shape
    out = torch.empty(positions, channels, dtype=layers.dtype, device=layers.device)
    _forward_kernel[(triton.cdiv(positions, FORWARD_BLOCK_P),)](
        layers, query, gate, out, num_layers, positions, channels, 0 if query.dim() == 1 else channels, eps,
        BLOCK_P=FORWARD_BLOCK_P, BLOCK_C=triton.next_power_of_2(channels), num_warps=8)
    return out


def backward(grad: torch.Tensor, layers: torch.Tensor, query: torch.Tensor, gate: torch.Tensor, eps: float,
             grad_layers: Optional[torch.Tensor] = None, accumulate: bool = False):
    """The gradients of the layers, the query and g given ``grad`` of H~, each in its input's precision; the layers'
    written into ``grad_layers`` where given (contiguous, as the layers), or added to what it holds
    (``accumulate``)."""
    num_layers, positions, channels = layers.shape
    grid, width = _meta(positions, num_layers)
    grad_layers = torch.empty_like(layers) if grad_layers is None else grad_layers
    static = query.dim() == 1
    # a static query's gradient in fp32 shares, one per program, summed after; a query per position's as it is
    grad_query = torch.empty(grid[0] if static else positions, channels,
                             dtype=torch.float32 if static else query.dtype, device=layers.device)
    gate_shares = torch.empty(grid[0], dtype=torch.float32, device=layers.device)
    _backward_kernel[grid](grad, layers, query, gate, grad_layers, grad_query, gate_shares, num_layers, positions,
                           channels, 0 if static else channels, eps, STATIC=static, ACCUMULATE=accumulate, L=width,
                           BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return grad_layers, grad_query.sum(0).to(query.dtype) if static else grad_query, gate_shares.sum().to(gate.dtype)
