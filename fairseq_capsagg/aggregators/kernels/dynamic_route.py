"""Dynamic routing's iterations in one Triton kernel each way (:mod:`.dynamic_route`).

Each program holds one position's votes (L x N x D, the layer's width d = N D) in registers, padded to powers of
two with zeros, and runs every iteration there, in fp32: the forward reads the votes once and writes the output
capsules once. The backward differentiates the iterations from the last to the first and recomputes, for each,
the logits it starts from (T (T + 1) / 2 iterations for T, against keeping T sets of intermediates).

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from ..numerics import ROUTING_EPS
from .common import position_votes, vote_offsets, warps


@triton.jit
def _softmax(logits, pair_live, OVER_INPUTS: tl.constexpr):
    """C: the softmax of the logits (L, N) over the input capsules (axis 0) or the output capsules (axis 1); padded
    entries get a logit that weighs nothing (finite, so that a row or column of padding stays free of NaN)."""
    logits = tl.where(pair_live, logits, -1e30)
    if OVER_INPUTS:
        exps = tl.exp(logits - tl.max(logits, axis=0)[None, :])
        out = exps / tl.sum(exps, axis=0)[None, :]
    else:
        exps = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        out = exps / tl.sum(exps, axis=1)[:, None]
    return tl.where(pair_live, out, 0.0)


@triton.jit
def _iteration(logits, votes, pair_live, eps, OVER_INPUTS: tl.constexpr):
    """C, S = sum_l C V, |S|^2 and Omega = squash(S) of one iteration."""
    agreement = _softmax(logits, pair_live, OVER_INPUTS)
    total = tl.sum(agreement[:, :, None] * votes, axis=0)
    sq_norm = tl.sum(total * total, axis=1)
    omega = total * (sq_norm / (1.0 + sq_norm) / tl.sqrt(sq_norm + eps))[:, None]
    return agreement, total, sq_norm, omega


@triton.jit
def _load(votes_ptr, position, stride_position, stride_layer, num_layers, capsules, capsule_dim, L: tl.constexpr,
          N: tl.constexpr, D: tl.constexpr):
    l = tl.arange(0, L)
    n = tl.arange(0, N)
    h = tl.arange(0, D)
    votes, inside = position_votes(votes_ptr, position, stride_position, stride_layer, num_layers, capsules,
                                   capsule_dim, L, N, D)
    pair_live = (l[:, None] < num_layers) & (n[None, :] < capsules)
    out_offsets = position * capsules * capsule_dim + n[:, None] * capsule_dim + h[None, :]
    out_live = (n[:, None] < capsules) & (h[None, :] < capsule_dim)
    return votes, inside, pair_live, out_offsets, out_live


@triton.jit
def _forward_kernel(votes_ptr, out_ptr, stride_position, stride_layer, num_layers, capsules, capsule_dim, iterations,
                    eps, OVER_INPUTS: tl.constexpr, L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    # every name assigned in a loop keeps one type (the compiler's rule): the loads' mask is not an iteration's "_"
    votes, inside, pair_live, out_offsets, out_live = _load(votes_ptr, tl.program_id(0), stride_position,
                                                            stride_layer, num_layers, capsules, capsule_dim, L, N, D)
    logits = tl.zeros((L, N), dtype=tl.float32)
    omega = tl.zeros((N, D), dtype=tl.float32)
    for step in range(iterations):
        agreement, total, sq_norm, omega = _iteration(logits, votes, pair_live, eps, OVER_INPUTS)
        logits += tl.sum(omega[None, :, :] * votes, axis=2)
    tl.store(out_ptr + out_offsets, omega, mask=out_live)


@triton.jit
def _backward_kernel(grad_ptr, votes_ptr, grad_votes_ptr, stride_position, stride_layer, grad_stride_position,
                     grad_stride_layer, num_layers, capsules, capsule_dim, iterations, eps, OVER_INPUTS: tl.constexpr,
                     L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    position = tl.program_id(0)
    votes, inside, pair_live, out_offsets, out_live = _load(votes_ptr, position, stride_position, stride_layer,
                                                            num_layers, capsules, capsule_dim, L, N, D)
    grad_out = tl.load(grad_ptr + out_offsets, mask=out_live, other=0.0)
    grad_votes = tl.zeros((L, N, D), dtype=tl.float32)
    grad_logits = tl.zeros((L, N), dtype=tl.float32)
    for back in range(iterations):
        step = iterations - 1 - back
        logits = tl.zeros((L, N), dtype=tl.float32)  # the logits this iteration starts from, recomputed
        for earlier in range(step):
            _, _, _, omega = _iteration(logits, votes, pair_live, eps, OVER_INPUTS)
            logits += tl.sum(omega[None, :, :] * votes, axis=2)
        agreement, total, sq_norm, omega = _iteration(logits, votes, pair_live, eps, OVER_INPUTS)
        if back == 0:
            grad_omega = grad_out
        else:  # B_{t+1} = B_t + Omega_t . V
            grad_omega = tl.sum(grad_logits[:, :, None] * votes, axis=0)
            grad_votes += grad_logits[:, :, None] * omega[None, :, :]
        # through squash: Omega = S f(q), q = |S|^2
        root = tl.sqrt(sq_norm + eps)
        factor = sq_norm / (1.0 + sq_norm) / root
        slope = ((sq_norm + eps) - 0.5 * sq_norm * (1.0 + sq_norm)) / ((1.0 + sq_norm) * (1.0 + sq_norm) * root
                                                                        * root * root)
        grad_total = grad_omega * factor[:, None] \
            + 2.0 * total * (tl.sum(grad_omega * total, axis=1) * slope)[:, None]
        grad_agreement = tl.sum(grad_total[None, :, :] * votes, axis=2)
        grad_votes += agreement[:, :, None] * grad_total[None, :, :]
        if OVER_INPUTS:
            grad_logits += agreement * (grad_agreement - tl.sum(agreement * grad_agreement, axis=0)[None, :])
        else:
            grad_logits += agreement * (grad_agreement - tl.sum(agreement * grad_agreement, axis=1)[:, None])
    offsets, _ = vote_offsets(position, grad_stride_position, grad_stride_layer, num_layers, capsules, capsule_dim, L,
                              N, D)
    tl.store(grad_votes_ptr + offsets, grad_votes, mask=inside)


def _meta(votes: torch.Tensor, over_inputs: bool):
    """The padded sizes, and the warps for a position's whole L x N x D tile."""
    _, num_layers, capsules, capsule_dim = votes.shape
    sizes = dict(L=triton.next_power_of_2(num_layers), N=triton.next_power_of_2(capsules),
                 D=triton.next_power_of_2(capsule_dim))
    return dict(sizes, OVER_INPUTS=over_inputs, num_warps=warps(sizes["L"] * sizes["N"] * sizes["D"]))


def forward(votes: torch.Tensor, iterations: int, over_inputs: bool) -> torch.Tensor:
    """The output capsules (P, N, D), fp32, from votes (P, L, N, D) of any precision, each layer's N x D block
    contiguous (:func:`..numerics.votes_by_position`)."""
    positions, num_layers, capsules, capsule_dim = votes.shape
    out = torch.empty(positions, capsules, capsule_dim, dtype=torch.float32, device=votes.device)
    _forward_kernel[(positions,)](votes, out, votes.stride(0), votes.stride(1), num_layers, capsules, capsule_dim,
                                  iterations, ROUTING_EPS, **_meta(votes, over_inputs))
    return out


def backward(grad: torch.Tensor, votes: torch.Tensor, iterations: int, over_inputs: bool) -> torch.Tensor:
    """The votes' gradient, in their precision and layout, given ``grad`` of the output capsules."""
    positions, num_layers, capsules, capsule_dim = votes.shape
    grad_votes = torch.empty_like(votes)
    _backward_kernel[(positions,)](grad, votes, grad_votes, votes.stride(0), votes.stride(1), grad_votes.stride(0),
                                   grad_votes.stride(1), num_layers, capsules, capsule_dim, iterations, ROUTING_EPS,
                                   **_meta(votes, over_inputs))
    return grad_votes
