"""EM routing's iterations in one Triton kernel each way (:mod:`.em_route`).

Each program runs ``POSITIONS`` positions one after another, each position's votes (L x N x D, the layer's width
d = N D) held in registers, padded to powers of two with zeros, every iteration run there, in fp32: the forward reads
the votes once and writes the output capsules once; beta_A and beta_mu are read once a program. The backward
differentiates the iterations from the last to the first and recomputes, for each, the iterations before it from the
votes (T (T + 1) / 2 M-steps for T iterations, against keeping T sets of (L, N, D) intermediates); it writes the
votes' and the input activations' gradients and, once a program, its share of beta_A's and beta_mu's (summed
afterwards), so that no two programs add into the same memory.

Imported only where Triton is (CUDA machines; the tests run it on the CPU with ``TRITON_INTERPRET=1``).
"""

import torch
import triton
import triton.language as tl

from ..numerics import HALF_LOG_2PI, ROUTING_EPS, VARIANCE_FLOOR
from .common import position_kernel, position_votes, vote_offsets, warps

#: Positions per program, one after another: beta_A and beta_mu are read, and the backward's shares of their
#: gradients (2 N floats) written, once a program.
POSITIONS = 16


@triton.jit
def _m_step(agreement, a, votes, inside, dim_live, beta_a, beta_mu, lam, eps, floor, half_log_2pi):
    """One M-step (Eqs. 12-15): R, S, the shares, mu, the deviations, sigma^2, log sigma^2 and z."""
    resp = agreement * a[:, None]
    resp_sum = tl.sum(resp, axis=0)
    share = resp / (resp_sum[None, :] + eps)
    mu = tl.sum(share[:, :, None] * votes, axis=0)
    deviation = tl.where(inside, votes - mu[None, :, :], 0.0)
    var = tl.sum(share[:, :, None] * deviation * deviation, axis=0) + floor
    log_var = tl.log(var)
    cost = resp_sum * tl.sum(tl.where(dim_live[None, :], 0.5 * log_var + 0.5 + half_log_2pi, 0.0), axis=1)
    act_logit = lam * (beta_a - beta_mu * resp_sum - cost)
    return resp, resp_sum, share, mu, deviation, var, log_var, act_logit


@triton.jit
def _log_sigmoid(x):
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _e_step(act_logit, deviation, var, log_var, inside, pair_live, capsule_live, capsule_dim, half_log_2pi):
    """The E-step (Eqs. 16-17): the next agreement, softmax over the capsules, zero where padded."""
    log_p = -0.5 * tl.sum(tl.where(inside, deviation * deviation / var[None, :, :] + log_var[None, :, :], 0.0), axis=2)
    logits = _log_sigmoid(act_logit)[None, :] + log_p - capsule_dim * half_log_2pi
    logits = tl.where(capsule_live[None, :], logits, float("-inf"))
    exps = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    return tl.where(pair_live, exps / tl.sum(exps, axis=1)[:, None], 0.0)


@triton.jit
def _betas(beta_a_ptr, beta_mu_ptr, capsules, N: tl.constexpr):
    """beta_A and beta_mu (N), fp32 (a bf16 model's upcast here): once a program."""
    n = tl.arange(0, N)
    return (tl.load(beta_a_ptr + n, mask=n < capsules, other=0.0).to(tl.float32),
            tl.load(beta_mu_ptr + n, mask=n < capsules, other=0.0).to(tl.float32))


@triton.jit
def _load(votes_ptr, act_ptr, position, stride_position, stride_layer, num_layers, capsules, capsule_dim,
          L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    l = tl.arange(0, L)
    n = tl.arange(0, N)
    h = tl.arange(0, D)
    votes, inside = position_votes(votes_ptr, position, stride_position, stride_layer, num_layers, capsules,
                                   capsule_dim, L, N, D)
    a = tl.load(act_ptr + position * num_layers + l, mask=l < num_layers, other=0.0)
    pair_live = (l[:, None] < num_layers) & (n[None, :] < capsules)
    start = tl.where(pair_live, 1.0 / capsules, 0.0)
    return votes, a, inside, pair_live, n < capsules, h < capsule_dim, start


@position_kernel
def _forward_kernel(votes_ptr, act_ptr, beta_a_ptr, beta_mu_ptr, out_ptr, stride_position, stride_layer, num_layers,
                    capsules, capsule_dim, positions, iterations, inverse_temperature, eps, floor, half_log_2pi,
                    POSITIONS: tl.constexpr, L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    program = tl.program_id(0)
    n = tl.arange(0, N)
    h = tl.arange(0, D)
    beta_a, beta_mu = _betas(beta_a_ptr, beta_mu_ptr, capsules, N)
    for position in range(program * POSITIONS, tl.minimum((program + 1) * POSITIONS, positions)):
        votes, a, inside, pair_live, capsule_live, dim_live, agreement = _load(
            votes_ptr, act_ptr, position, stride_position, stride_layer, num_layers, capsules, capsule_dim, L, N, D)
        mu = tl.zeros((N, D), dtype=tl.float32)
        act_logit = tl.zeros((N,), dtype=tl.float32)
        for step in range(iterations):
            lam = inverse_temperature * (step + 1) / iterations
            _, _, _, mu, deviation, var, log_var, act_logit = _m_step(agreement, a, votes, inside, dim_live, beta_a,
                                                                      beta_mu, lam, eps, floor, half_log_2pi)
            if step + 1 < iterations:
                agreement = _e_step(act_logit, deviation, var, log_var, inside, pair_live, capsule_live, capsule_dim,
                                    half_log_2pi)
        out = tl.sigmoid(act_logit)[:, None] * mu
        tl.store(out_ptr + position * capsules * capsule_dim + n[:, None] * capsule_dim + h[None, :], out,
                 mask=capsule_live[:, None] & dim_live[None, :])


@position_kernel
def _backward_kernel(grad_ptr, votes_ptr, act_ptr, beta_a_ptr, beta_mu_ptr, grad_votes_ptr, grad_act_ptr,
                     grad_beta_ptr, stride_position, stride_layer, grad_stride_position, grad_stride_layer,
                     num_layers, capsules, capsule_dim, positions, iterations, inverse_temperature, eps, floor,
                     half_log_2pi, POSITIONS: tl.constexpr, L: tl.constexpr, N: tl.constexpr, D: tl.constexpr):
    program = tl.program_id(0)
    n = tl.arange(0, N)
    beta_a, beta_mu = _betas(beta_a_ptr, beta_mu_ptr, capsules, N)
    beta_a_share = tl.zeros((N,), dtype=tl.float32)
    beta_mu_share = tl.zeros((N,), dtype=tl.float32)
    for position in range(program * POSITIONS, tl.minimum((program + 1) * POSITIONS, positions)):
        votes, a, inside, pair_live, capsule_live, dim_live, start = _load(
            votes_ptr, act_ptr, position, stride_position, stride_layer, num_layers, capsules, capsule_dim, L, N, D)
        h = tl.arange(0, D)
        grad = tl.load(grad_ptr + position * capsules * capsule_dim + n[:, None] * capsule_dim + h[None, :],
                       mask=capsule_live[:, None] & dim_live[None, :], other=0.0)
        grad_votes = tl.zeros((L, N, D), dtype=tl.float32)
        grad_a = tl.zeros((L,), dtype=tl.float32)
        grad_beta_a = tl.zeros((N,), dtype=tl.float32)
        grad_beta_mu = tl.zeros((N,), dtype=tl.float32)
        grad_agreement = tl.zeros((L, N), dtype=tl.float32)
        for back in range(iterations):
            step = iterations - 1 - back
            # the agreement this iteration starts from: the iterations before it, recomputed
            agreement = start
            for earlier in range(step):
                lam = inverse_temperature * (earlier + 1) / iterations
                _, _, _, _, deviation, var, log_var, act_logit = _m_step(agreement, a, votes, inside, dim_live, beta_a,
                                                                         beta_mu, lam, eps, floor, half_log_2pi)
                agreement = _e_step(act_logit, deviation, var, log_var, inside, pair_live, capsule_live, capsule_dim,
                                    half_log_2pi)
            lam = inverse_temperature * (step + 1) / iterations
            resp, resp_sum, share, mu, deviation, var, log_var, act_logit = _m_step(
                agreement, a, votes, inside, dim_live, beta_a, beta_mu, lam, eps, floor, half_log_2pi)
            if back == 0:  # the output sigmoid(z) mu
                act = tl.sigmoid(act_logit)
                grad_mu = grad * act[:, None]
                grad_act_logit = tl.sum(grad * mu, axis=1) * act * (1.0 - act)
                grad_dev_sq = tl.zeros((L, N, D), dtype=tl.float32)
                grad_var = tl.zeros((N, D), dtype=tl.float32)
                grad_log_var = tl.zeros((N, D), dtype=tl.float32)
            else:  # the E-step: C' = softmax_n(log sigmoid(z) + log p)
                following = _e_step(act_logit, deviation, var, log_var, inside, pair_live, capsule_live, capsule_dim,
                                    half_log_2pi)
                grad_u = following * (grad_agreement - tl.sum(following * grad_agreement, axis=1)[:, None])
                grad_act_logit = tl.sum(grad_u, axis=0) * (1.0 - tl.sigmoid(act_logit))
                grad_dev_sq = tl.where(inside, -0.5 * grad_u[:, :, None] / var[None, :, :], 0.0)
                grad_var = 0.5 * tl.sum(grad_u[:, :, None] * deviation * deviation, axis=0) / (var * var)
                grad_log_var = tl.where(dim_live[None, :], -0.5 * tl.sum(grad_u, axis=0)[:, None], 0.0)
                grad_mu = tl.zeros((N, D), dtype=tl.float32)
            # z = lam (beta_A - beta_mu S - cost), cost = S (sum_h log var / 2 + D k0)
            grad_beta_a += lam * grad_act_logit
            grad_beta_mu -= lam * grad_act_logit * resp_sum
            grad_cost = -lam * grad_act_logit
            grad_resp_sum = -lam * grad_act_logit * beta_mu + grad_cost * tl.sum(
                tl.where(dim_live[None, :], 0.5 * log_var + 0.5 + half_log_2pi, 0.0), axis=1)
            grad_log_var = tl.where(dim_live[None, :], grad_log_var + 0.5 * (grad_cost * resp_sum)[:, None], 0.0)
            grad_var = grad_var + grad_log_var / var
            # var = sum_l share dev^2 + floor, mu = sum_l share V
            grad_share = tl.sum(grad_var[None, :, :] * deviation * deviation, axis=2)
            grad_deviation = 2.0 * deviation * (grad_dev_sq + grad_var[None, :, :] * share[:, :, None])
            grad_mu = grad_mu - tl.sum(grad_deviation, axis=0)
            grad_votes += tl.where(inside, grad_deviation + share[:, :, None] * grad_mu[None, :, :], 0.0)
            grad_share += tl.sum(grad_mu[None, :, :] * votes, axis=2)
            # share = R / (S + eps), S = sum_l R, R = C a
            denominator = resp_sum[None, :] + eps
            grad_resp_sum -= tl.sum(grad_share * resp / (denominator * denominator), axis=0)
            grad_resp = tl.where(pair_live, grad_share / denominator + grad_resp_sum[None, :], 0.0)
            grad_a += tl.sum(grad_resp * agreement, axis=1)
            grad_agreement = grad_resp * a[:, None]
        l = tl.arange(0, L)
        offsets, _ = vote_offsets(position, grad_stride_position, grad_stride_layer, num_layers, capsules,
                                  capsule_dim, L, N, D)
        tl.store(grad_votes_ptr + offsets, grad_votes, mask=inside)
        tl.store(grad_act_ptr + position * num_layers + l, grad_a, mask=l < num_layers)
        beta_a_share += grad_beta_a
        beta_mu_share += grad_beta_mu
    # this program's shares of beta_A's and beta_mu's gradients
    tl.store(grad_beta_ptr + program * 2 * capsules + n, beta_a_share, mask=n < capsules)
    tl.store(grad_beta_ptr + program * 2 * capsules + capsules + n, beta_mu_share, mask=n < capsules)


def _meta(votes: torch.Tensor, backward: bool = False):
    """The padded sizes, and the warps for a position's whole L x N x D tile; the backward, which keeps about twice
    the forward's tiles live, spreads its tile over the warps of one half its size (at `base`, 16 warps cap a thread
    at 128 registers, and the backward then spilled: kernels-compiled.md)."""
    _, num_layers, capsules, capsule_dim = votes.shape
    sizes = dict(L=triton.next_power_of_2(num_layers), N=triton.next_power_of_2(capsules),
                 D=triton.next_power_of_2(capsule_dim))
    tile = sizes["L"] * sizes["N"] * sizes["D"]
    return dict(sizes, num_warps=warps(tile // 2 if backward else tile))


def forward(votes: torch.Tensor, input_act: torch.Tensor, beta_a: torch.Tensor, beta_mu: torch.Tensor,
            iterations: int, inverse_temperature: float) -> torch.Tensor:
    """The output capsules (P, N, D), fp32, from votes (P, L, N, D) of any precision, each layer's N x D block
    contiguous (:func:`..numerics.votes_by_position`), contiguous fp32 input activations (P, L) and beta_A, beta_mu
    (N)."""
    positions, num_layers, capsules, capsule_dim = votes.shape
    out = torch.empty(positions, capsules, capsule_dim, dtype=torch.float32, device=votes.device)
    _forward_kernel[(triton.cdiv(positions, POSITIONS),)](
        votes, input_act, beta_a, beta_mu, out, votes.stride(0), votes.stride(1), num_layers, capsules, capsule_dim,
        positions, iterations, inverse_temperature, ROUTING_EPS, VARIANCE_FLOOR, HALF_LOG_2PI, POSITIONS=POSITIONS,
        **_meta(votes))
    return out


def backward(grad: torch.Tensor, votes: torch.Tensor, input_act: torch.Tensor, beta_a: torch.Tensor,
             beta_mu: torch.Tensor, iterations: int, inverse_temperature: float):
    """The gradients of the votes (in their precision and layout), the input activations, beta_A and beta_mu given
    ``grad`` of the output."""
    positions, num_layers, capsules, capsule_dim = votes.shape
    grad_votes = torch.empty_like(votes)
    grad_act = torch.empty_like(input_act)
    programs = triton.cdiv(positions, POSITIONS)
    grad_beta = torch.empty(programs, 2, capsules, dtype=torch.float32, device=votes.device)
    _backward_kernel[(programs,)](grad, votes, input_act, beta_a, beta_mu, grad_votes, grad_act, grad_beta,
                                  votes.stride(0), votes.stride(1), grad_votes.stride(0), grad_votes.stride(1),
                                  num_layers, capsules, capsule_dim, positions, iterations, inverse_temperature,
                                  ROUTING_EPS, VARIANCE_FLOOR, HALF_LOG_2PI, POSITIONS=POSITIONS,
                                  **_meta(votes, backward=True))
    # each its own sum: an operator's outputs never alias one another
    return grad_votes, grad_act, grad_beta[:, 0].sum(0).to(beta_a.dtype), grad_beta[:, 1].sum(0).to(beta_mu.dtype)
