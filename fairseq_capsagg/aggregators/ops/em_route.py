"""EM routing's iterations (Algorithm 2 of Dou et al. 2019, Eqs. 12-17): the eager loop (the reference) and one
fused operator each way (``capsagg::em_route``: one Triton kernel on CUDA, :mod:`..kernels.em_route`; the loop and
:func:`reference_backward` inside the operator elsewhere). ``--connection-kernels`` picks; both compute the same
values and gradients.

Per position, with the votes V (L, N, D), the input activations a (L) and C = 1/N at the start, iteration t of T:
the M-step R = C a, S_n = sum_l R_ln, mu and sigma^2 as the R-weighted mean and variance of the votes (floored),
cost_n = S_n sum_h (log sigma_nh + (1 + log 2 pi) / 2), z_n = lambda_t (beta_A,n - beta_mu,n S_n - cost_n) with
lambda_t = lambda t / T; then, but after the last, the E-step C = softmax_n(log sigmoid(z_n) + log p_n(V_l)). The
output is sigmoid(z) mu.
"""

from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..numerics import HALF_LOG_2PI, ROUTING_EPS, VARIANCE_FLOOR, votes_by_position
from .dispatch import runs_fused, triton_kernels

class MStep(NamedTuple):
    """One M-step's results (Eqs. 12-15), (..., L, N) and (..., N[, D])."""

    resp: Tensor  # R = C a
    resp_sum: Tensor  # S_n = sum_l R_ln
    share: Tensor  # R / (S + eps)
    mu: Tensor
    deviation: Tensor  # V - mu
    var: Tensor  # sigma^2, floored
    log_var: Tensor
    act_logit: Tensor  # z


def m_step(agreement: Tensor, input_act: Tensor, votes: Tensor, beta_a: Tensor, beta_mu: Tensor,
           lam: float) -> MStep:
    """The M-step (Eqs. 12-15): mu and sigma^2 as the R-weighted mean and variance of the votes, the cost and z."""
    resp = agreement * input_act.unsqueeze(-1)
    resp_sum = resp.sum(dim=-2)
    share = resp / (resp_sum.unsqueeze(-2) + ROUTING_EPS)
    mu = (share.unsqueeze(-1) * votes).sum(dim=-3)
    deviation = votes - mu.unsqueeze(-3)
    var = (share.unsqueeze(-1) * deviation.square()).sum(dim=-3) + VARIANCE_FLOOR
    log_var = torch.log(var)
    cost = ((0.5 * log_var + 0.5 + HALF_LOG_2PI) * resp_sum.unsqueeze(-1)).sum(dim=-1)
    act_logit = lam * (beta_a - beta_mu * resp_sum - cost)
    return MStep(resp, resp_sum, share, mu, deviation, var, log_var, act_logit)


def e_step(m: MStep) -> Tensor:
    """The E-step (Eqs. 16-17) in log space: C = softmax_n(log sigmoid(z_n) + log p_n(V_l))."""
    log_p = -0.5 * (m.deviation.square() / m.var.unsqueeze(-3) + m.log_var.unsqueeze(-3)).sum(dim=-1)
    log_p = log_p - m.deviation.size(-1) * HALF_LOG_2PI
    return torch.softmax(F.logsigmoid(m.act_logit).unsqueeze(-2) + log_p, dim=-1)


def em_iterations(votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
                  inverse_temperature: float,
                  record: Optional[Callable[[Tensor, Tensor], None]] = None) -> Tensor:
    """The output capsules sigmoid(z) mu (..., N, D) from fp32 votes (..., L, N, D) and input activations (..., L);
    ``record(C, z)`` sees each iteration's agreement before its M-step and its activation logits after it."""
    agreement = votes.new_full(votes.shape[:-1], 1.0 / votes.size(-2))
    for step in range(iterations):
        m = m_step(agreement, input_act, votes, beta_a, beta_mu, inverse_temperature * (step + 1) / iterations)
        if record is not None:
            record(agreement, m.act_logit)
        if step + 1 < iterations:
            agreement = e_step(m)
    return torch.sigmoid(m.act_logit).unsqueeze(-1) * m.mu


def reference_backward(grad: Tensor, votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor,
                       iterations: int, inverse_temperature: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`em_iterations`' votes (P, L, N, D), input activations (P, L), beta_A and beta_mu (N)
    from that of its output (P, N, D), written out (autograd's values, without its graph): the iterations'
    intermediates are kept from one forward pass, then each iteration is differentiated from the last to the
    first, its E-step (softmax, log sigmoid, log density) before its M-step (weighted mean and variance, cost)."""
    agreements: List[Tensor] = [votes.new_full(votes.shape[:-1], 1.0 / votes.size(-2))]
    steps: List[MStep] = []
    for step in range(iterations):
        lam = inverse_temperature * (step + 1) / iterations
        steps.append(m_step(agreements[-1], input_act, votes, beta_a, beta_mu, lam))
        if step + 1 < iterations:
            agreements.append(e_step(steps[-1]))
    grad = grad.float()
    act = torch.sigmoid(steps[-1].act_logit)
    grad_mu = grad * act.unsqueeze(-1)
    grad_act_logit = (grad * steps[-1].mu).sum(-1) * act * (1.0 - act)
    grad_votes = torch.zeros_like(votes)
    grad_input_act = torch.zeros_like(input_act)
    grad_beta_a = torch.zeros_like(beta_a)
    grad_beta_mu = torch.zeros_like(beta_mu)
    grad_agreement = None
    for step in reversed(range(iterations)):
        lam = inverse_temperature * (step + 1) / iterations
        resp, resp_sum, share, mu, deviation, var, log_var, act_logit = steps[step]
        if step + 1 < iterations:  # E-step: C' = softmax_n(log sigmoid(z) + log p)
            following = agreements[step + 1]
            grad_u = following * (grad_agreement - (following * grad_agreement).sum(-1, keepdim=True))
            grad_act_logit = (grad_u * (1.0 - torch.sigmoid(act_logit)).unsqueeze(-2)).sum(-2)
            grad_dev_sq = -0.5 * grad_u.unsqueeze(-1) / var.unsqueeze(-3)
            grad_var = 0.5 * (grad_u.unsqueeze(-1) * deviation.square()).sum(-3) / var.square()
            grad_log_var = -0.5 * grad_u.sum(-2).unsqueeze(-1).expand_as(var)
            grad_mu = torch.zeros_like(mu)
        else:
            grad_dev_sq = torch.zeros_like(deviation)
            grad_var = torch.zeros_like(var)
            grad_log_var = torch.zeros_like(var)
        # z = lam (beta_A - beta_mu S - cost), cost = S (sum_h log var / 2 + D k0)
        grad_beta_a += lam * grad_act_logit.reshape(-1, beta_a.numel()).sum(0)
        grad_beta_mu -= lam * (grad_act_logit * resp_sum).reshape(-1, beta_mu.numel()).sum(0)
        grad_cost = -lam * grad_act_logit
        grad_resp_sum = -lam * grad_act_logit * beta_mu
        grad_resp_sum = grad_resp_sum + grad_cost * (0.5 * log_var + 0.5 + HALF_LOG_2PI).sum(-1)
        grad_log_var = grad_log_var + 0.5 * (grad_cost * resp_sum).unsqueeze(-1)
        grad_var = grad_var + grad_log_var / var
        # var = sum_l share dev^2 + floor, mu = sum_l share V
        grad_share = (grad_var.unsqueeze(-3) * deviation.square()).sum(-1)
        grad_dev_sq = grad_dev_sq + grad_var.unsqueeze(-3) * share.unsqueeze(-1)
        grad_deviation = 2.0 * deviation * grad_dev_sq
        grad_mu = grad_mu - grad_deviation.sum(-3)
        grad_votes += grad_deviation + share.unsqueeze(-1) * grad_mu.unsqueeze(-3)
        grad_share = grad_share + (grad_mu.unsqueeze(-3) * votes).sum(-1)
        # share = R / (S + eps), S = sum_l R, R = C a
        denominator = resp_sum.unsqueeze(-2) + ROUTING_EPS
        grad_resp_sum = grad_resp_sum - (grad_share * resp / denominator.square()).sum(-2)
        grad_resp = grad_share / denominator + grad_resp_sum.unsqueeze(-2)
        grad_input_act += (grad_resp * agreements[step]).sum(-1)
        grad_agreement = grad_resp * input_act.unsqueeze(-1)
    return grad_votes, grad_input_act, grad_beta_a, grad_beta_mu


@torch.library.custom_op("capsagg::em_route", mutates_args=())
def _fused(votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
           inverse_temperature: float) -> Tensor:
    kernels = triton_kernels(__name__, votes)
    if kernels is not None:
        return kernels.forward(votes, input_act, beta_a, beta_mu, iterations, inverse_temperature)
    return em_iterations(votes.float(), input_act, beta_a.float(), beta_mu.float(), iterations, inverse_temperature)


@_fused.register_fake
def _(votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
      inverse_temperature: float) -> Tensor:
    return votes.new_empty(votes.size(0), *votes.shape[2:], dtype=torch.float32)


@torch.library.custom_op("capsagg::em_route_backward", mutates_args=())
def _fused_backward(grad: Tensor, votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
                    inverse_temperature: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    kernels = triton_kernels(__name__, votes)
    if kernels is not None:
        return kernels.backward(grad, votes, input_act, beta_a, beta_mu, iterations, inverse_temperature)
    grad_votes, grad_act, grad_beta_a, grad_beta_mu = reference_backward(
        grad, votes.float(), input_act, beta_a.float(), beta_mu.float(), iterations, inverse_temperature)
    return grad_votes.to(votes.dtype), grad_act, grad_beta_a.to(beta_a.dtype), grad_beta_mu.to(beta_mu.dtype)


@_fused_backward.register_fake
def _(grad: Tensor, votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
      inverse_temperature: float) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return torch.empty_like(votes), torch.empty_like(input_act), torch.empty_like(beta_a), torch.empty_like(beta_mu)


def _setup_context(ctx, inputs: Tuple, output: Tensor) -> None:
    ctx.save_for_backward(*inputs[:4])
    ctx.iterations, ctx.inverse_temperature = inputs[4], inputs[5]


def _backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
    return (*_fused_backward(grad.contiguous(), *ctx.saved_tensors, ctx.iterations, ctx.inverse_temperature),
            None, None)


_fused.register_autograd(_backward, setup_context=_setup_context)


def em_route(votes: Tensor, input_act: Tensor, beta_a: Tensor, beta_mu: Tensor, iterations: int,
             inverse_temperature: float, kernel: str = "auto") -> Tensor:
    """:func:`em_iterations` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`), in fp32 for votes
    (..., L, N, D) and beta_A, beta_mu (N) of any precision and fp32 input activations (..., L): the output capsules
    (..., N, D), fp32. The fused operator reads the votes in place and saves them as they are for its backward
    (:func:`..numerics.votes_by_position`), and reads beta_A and beta_mu as they are (returning their gradients in
    their precision), so that no cast of them runs each way; the loop routes fp32 copies."""
    if not runs_fused(kernel, votes):
        return em_iterations(votes.float(), input_act, beta_a.float(), beta_mu.float(), iterations,
                             inverse_temperature)
    batch = votes.shape[:-3]
    out = _fused(votes_by_position(votes),
                 input_act.reshape(-1, input_act.size(-1)).contiguous(), beta_a.contiguous(),
                 beta_mu.contiguous(), iterations, float(inverse_temperature))
    return out.view(*batch, *votes.shape[-2:])
