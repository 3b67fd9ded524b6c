"""EM routing's input activations in one Triton kernel each way (:mod:`.input_activation`).

Per position, with the L input capsules H^_l (L x C): A^H_l = logistic(H^_l . W^H_l + b_l), in fp32 whatever the
capsules' and the weights' precision. Each program holds ``BLOCK_P`` positions and walks their C channels in chunks
of ``BLOCK_C``, every layer at once; the backward reads the activations the forward stored, writes the capsules'
gradient in their precision and, per program, its share of the gradients of W^H and b (summed afterwards), so
that no two programs add into the same memory. L is padded to the next power of two with zeros.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from .common import position_kernel

BLOCK_P = 16
BLOCK_C = 64


@triton.jit
def _chunk(capsules_ptr, weight_ptr, p, l, c, live, layers, channels):
    """The capsules (P, L, BLOCK_C) and W^H (L, BLOCK_C) of chunk c in fp32, zero where padded, and the capsules'
    offsets and mask."""
    inside = live[:, None, None] & (l[None, :, None] < layers) & (c[None, None, :] < channels)
    offsets = p[:, None, None] * layers * channels + l[None, :, None] * channels + c[None, None, :]
    capsules = tl.load(capsules_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + l[:, None] * channels + c[None, :],
                     mask=(l[:, None] < layers) & (c[None, :] < channels), other=0.0).to(tl.float32)
    return capsules, weight, offsets, inside


@position_kernel
def _forward_kernel(capsules_ptr, weight_ptr, bias_ptr, out_ptr, positions, layers, channels, L: tl.constexpr,
                    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    live = p < positions
    logit = tl.zeros((BLOCK_P, L), dtype=tl.float32)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        capsules, weight, _, _ = _chunk(capsules_ptr, weight_ptr, p, l, c, live, layers, channels)
        logit += tl.sum(capsules * weight[None, :, :], axis=2)
    logit += tl.load(bias_ptr + l, mask=l < layers, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + p[:, None] * layers + l[None, :], 1.0 / (1.0 + tl.exp(-logit)),
             mask=live[:, None] & (l[None, :] < layers))


@position_kernel
def _backward_kernel(grad_ptr, act_ptr, capsules_ptr, weight_ptr, grad_capsules_ptr, weight_shares_ptr,
                     bias_shares_ptr, positions, layers, channels, L: tl.constexpr, BLOCK_P: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    p = program * BLOCK_P + tl.arange(0, BLOCK_P)
    l = tl.arange(0, L)
    live = p < positions
    pl_live = live[:, None] & (l[None, :] < layers)
    act = tl.load(act_ptr + p[:, None] * layers + l[None, :], mask=pl_live, other=0.0)
    grad_logit = tl.load(grad_ptr + p[:, None] * layers + l[None, :], mask=pl_live, other=0.0) * act * (1.0 - act)
    tl.store(bias_shares_ptr + program * layers + l, tl.sum(grad_logit, axis=0), mask=l < layers)
    for start in range(0, channels, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        capsules, weight, offsets, inside = _chunk(capsules_ptr, weight_ptr, p, l, c, live, layers, channels)
        tl.store(grad_capsules_ptr + offsets, (grad_logit[:, :, None] * weight[None, :, :])
                 .to(grad_capsules_ptr.dtype.element_ty), mask=inside)
        tl.store(weight_shares_ptr + program * layers * channels + l[:, None] * channels + c[None, :],
                 tl.sum(grad_logit[:, :, None] * capsules, axis=0),
                 mask=(l[:, None] < layers) & (c[None, :] < channels))


def _meta(positions: int, layers: int):
    return (triton.cdiv(positions, BLOCK_P),), triton.next_power_of_2(layers)


def forward(capsules: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A^H (P, L) fp32 from contiguous capsules (P, L, C), W^H (L, C) and b (L), each in any precision."""
    positions, layers, channels = capsules.shape
    out = torch.empty(positions, layers, dtype=torch.float32, device=capsules.device)
    grid, width = _meta(positions, layers)
    _forward_kernel[grid](capsules, weight, bias, out, positions, layers, channels, L=width, BLOCK_P=BLOCK_P,
                          BLOCK_C=BLOCK_C)
    return out


def backward(grad: torch.Tensor, act: torch.Tensor, capsules: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    """The gradients of the capsules, W^H and b, each in its input's precision, from A^H's (P, L) and A^H itself."""
    positions, layers, channels = capsules.shape
    grid, width = _meta(positions, layers)
    grad_capsules = torch.empty_like(capsules)
    weight_shares = torch.empty(grid[0], layers, channels, dtype=torch.float32, device=capsules.device)
    bias_shares = torch.empty(grid[0], layers, dtype=torch.float32, device=capsules.device)
    _backward_kernel[grid](grad, act, capsules, weight, grad_capsules, weight_shares, bias_shares, positions, layers,
                           channels, L=width, BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C)
    return grad_capsules, weight_shares.sum(0).to(weight.dtype), bias_shares.sum(0).to(bias.dtype)
