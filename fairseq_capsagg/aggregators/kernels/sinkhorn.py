"""Sinkhorn-Knopp in one Triton kernel each way (mHC's H_res, :mod:`.sinkhorn`).

Each program holds ``BLOCK`` positions' n x n matrices in registers and runs every iteration there: the
forward reads the logits once and writes the doubly stochastic matrices once; the backward recomputes the
iterates it needs (iteration t from the logits, for t = T - 1 down to 0) instead of storing 2T of them. The
arithmetic is :func:`..ops.sinkhorn.sinkhorn_reference`'s, in fp32 and log space: a column normalisation (each
column over its rows) then a row normalisation, T times, and exp. Matrices are padded to the next power of two
with -inf logits, which stay -inf and weigh nothing. With ``TRANSPOSED`` (mHC's H_res as mixing rows,
:func:`.sinkhorn.mhc_mix`) the forward writes P^T and the backward takes its gradient; with ``BLEND`` (mHC's H_res of a
checkpoint of the start before) the forward writes I + g (P^T - I) for the gate g = clamp(gate, 0, 1), and the
backward takes that output's gradient and also writes, per program, its share of the gate's (the identity through
the clamp).

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import position_kernel

#: Positions per program.
BLOCK = 32


@triton.jit
def _normalise(x, valid, AXIS: tl.constexpr):
    """x - logsumexp(x) over AXIS (1: each column over its rows, 2: each row over its columns); -inf stays."""
    peak = tl.max(x, axis=AXIS)
    peak = tl.where(peak == float("-inf"), 0.0, peak)
    total = tl.sum(tl.exp(x - tl.expand_dims(peak, AXIS)), axis=AXIS)
    total = tl.where(total == 0.0, 1.0, total)
    out = x - tl.expand_dims(peak + tl.log(total), AXIS)
    return tl.where(valid, out, float("-inf"))


@triton.jit
def _iterate(x, valid, iterations):
    for _ in range(iterations):
        x = _normalise(x, valid, 1)
        x = _normalise(x, valid, 2)
    return x


@triton.jit
def _offsets(positions, n, N: tl.constexpr, BLOCK_P: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    i = tl.arange(0, N)
    j = tl.arange(0, N)
    p3 = p[:, None, None]
    i3 = i[None, :, None]
    j3 = j[None, None, :]
    offsets = p3 * n * n + i3 * n + j3
    inside = (p3 < positions) & (i3 < n) & (j3 < n)
    transposed = p3 * n * n + j3 * n + i3
    return offsets, transposed, inside, (i3 < n) & (j3 < n), i3 == j3


@position_kernel
def _forward_kernel(logits_ptr, gate_ptr, out_ptr, positions, n, iterations, TRANSPOSED: tl.constexpr,
                    BLEND: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr):
    offsets, transposed, inside, valid, diagonal = _offsets(positions, n, N, BLOCK_P)
    x = tl.load(logits_ptr + offsets, mask=inside, other=float("-inf"))
    x = tl.where(valid, x, float("-inf"))
    matrices = tl.exp(_iterate(x, valid, iterations))
    if BLEND:
        gate = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
        identity = tl.where(diagonal, 1.0, 0.0)
        tl.store(out_ptr + transposed, identity + gate * (matrices - identity), mask=inside)
    elif TRANSPOSED:
        tl.store(out_ptr + transposed, matrices, mask=inside)
    else:
        tl.store(out_ptr + offsets, matrices, mask=inside)


@position_kernel
def _backward_kernel(logits_ptr, gate_ptr, grad_ptr, out_ptr, gate_shares_ptr, positions, n, iterations,
                     TRANSPOSED: tl.constexpr, BLEND: tl.constexpr, N: tl.constexpr, BLOCK_P: tl.constexpr):
    offsets, transposed, inside, valid, diagonal = _offsets(positions, n, N, BLOCK_P)
    logits = tl.load(logits_ptr + offsets, mask=inside, other=float("-inf"))
    logits = tl.where(valid, logits, float("-inf"))
    matrices = tl.exp(_iterate(logits, valid, iterations))
    if BLEND:  # back through I + g (P^T - I)
        grad = tl.load(grad_ptr + transposed, mask=inside, other=0.0)
        gate = tl.minimum(tl.maximum(tl.load(gate_ptr).to(tl.float32), 0.0), 1.0)
        identity = tl.where(diagonal, 1.0, 0.0)
        tl.store(gate_shares_ptr + tl.program_id(0),
                 tl.sum(tl.sum(tl.sum(grad * (matrices - identity), axis=2), axis=1), axis=0))
        grad = gate * grad
    elif TRANSPOSED:
        grad = tl.load(grad_ptr + transposed, mask=inside, other=0.0)
    else:
        grad = tl.load(grad_ptr + offsets, mask=inside, other=0.0)
    grad = grad * matrices  # through exp
    for back in range(iterations):
        t = iterations - 1 - back
        columns = _normalise(_iterate(logits, valid, t), valid, 1)  # iteration t's column step
        rows = _normalise(columns, valid, 2)  # and its row step
        # through x - logsumexp(x): g - softmax(x) * sum(g), softmax(x) = exp(the step's output)
        grad = grad - tl.exp(rows) * tl.expand_dims(tl.sum(grad, axis=2), 2)
        grad = grad - tl.exp(columns) * tl.expand_dims(tl.sum(grad, axis=1), 1)
        grad = tl.where(valid, grad, 0.0)
    tl.store(out_ptr + offsets, grad, mask=inside)


def _grid(logits: torch.Tensor):
    n = logits.size(-1)
    return (triton.cdiv(logits.numel() // (n * n), BLOCK),), dict(N=triton.next_power_of_2(n), BLOCK_P=BLOCK)


def forward(logits: torch.Tensor, iterations: int, gate: Optional[torch.Tensor] = None,
            transposed: bool = False) -> torch.Tensor:
    """The doubly stochastic matrices P of ``logits`` (P, n, n), fp32 and contiguous, or P^T (``transposed``); with a
    ``gate`` (any precision, read in fp32), I + g (P^T - I)."""
    out = torch.empty_like(logits)
    grid, meta = _grid(logits)
    _forward_kernel[grid](logits, logits if gate is None else gate, out, logits.size(0), logits.size(-1), iterations,
                          TRANSPOSED=transposed or gate is not None, BLEND=gate is not None, **meta)
    return out


def backward(logits: torch.Tensor, grad: torch.Tensor, iterations: int, gate: Optional[torch.Tensor] = None,
             transposed: bool = False):
    """The gradient with respect to ``logits`` of the forward's output given ``grad`` (both (P, n, n)); for mHC's
    mix (``transposed`` or a ``gate``) with the gate's, in its precision (without a gate, an empty tensor)."""
    out = torch.empty_like(logits)
    grid, meta = _grid(logits)
    shares = torch.empty(grid[0], dtype=torch.float32, device=logits.device)
    _backward_kernel[grid](logits, logits if gate is None else gate, grad, out, shares, logits.size(0),
                           logits.size(-1), iterations, TRANSPOSED=transposed or gate is not None,
                           BLEND=gate is not None, **meta)
    if not transposed and gate is None:
        return out
    return out, logits.new_empty(0) if gate is None else shares.sum().to(gate.dtype)
