"""Dynamic routing's iterations (Algorithm 1 of Dou et al. 2019, Eqs. 6-10): the eager loop (the reference) and one
fused operator each way (``capsagg::dynamic_route``: one Triton kernel on CUDA, :mod:`..kernels.dynamic_route`; the
loop and :func:`reference_backward` inside the operator elsewhere). ``--connection-kernels`` picks; both compute
the same values and gradients.

Per position, with the votes V (L, N, D) and logits B = 0 at the start, iteration t of T: C = softmax(B) over the
output capsules n (the paper's) or the input capsules l (Eq. 10), S_n = sum_l C_ln V_ln (Eq. 7),
Omega_n = squash(S_n) (Eq. 6) and, but after the last, B_ln += Omega_n . V_ln. The output is Omega.
"""

from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from ..numerics import ROUTING_EPS, squash, votes_by_position
from .dispatch import runs_fused, triton_kernels


def routing_iterations(votes: Tensor, iterations: int, over_inputs: bool,
                       record: Optional[Callable[[Tensor], None]] = None) -> Tensor:
    """The output capsules Omega (..., N, D) from fp32 votes (..., L, N, D), the softmax over the input capsules
    when ``over_inputs``; ``record(C)`` sees each iteration's agreement."""
    logits = votes.new_zeros(votes.shape[:-1])
    for step in range(iterations):
        agreement, _, omega = iteration(logits, votes, over_inputs)
        if record is not None:
            record(agreement)
        if step + 1 < iterations:
            logits = logits + (omega.unsqueeze(-3) * votes).sum(dim=-1)
    return omega


def iteration(logits: Tensor, votes: Tensor, over_inputs: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """One iteration from the logits B: C = softmax(B) (Eq. 10), S_n = sum_l C_ln V_ln (Eq. 7) and
    Omega = squash(S) (Eq. 6)."""
    agreement = torch.softmax(logits, dim=-2 if over_inputs else -1)
    total = (agreement.unsqueeze(-1) * votes).sum(dim=-3)
    return agreement, total, squash(total)


def squash_derivative(sq_norm: Tensor) -> Tensor:
    """f'(q) of squash's factor f(q) = q / ((1 + q) sqrt(q + eps)), Omega = S f(|S|^2)."""
    root = torch.sqrt(sq_norm + ROUTING_EPS)
    return ((sq_norm + ROUTING_EPS) - 0.5 * sq_norm * (1.0 + sq_norm)) / ((1.0 + sq_norm).square() * root.pow(3))


def reference_backward(grad: Tensor, votes: Tensor, iterations: int, over_inputs: bool) -> Tensor:
    """The gradient of :func:`routing_iterations`' votes (P, L, N, D) from that of its output (P, N, D), written
    out (autograd's values, without its graph): each iteration from the last to the first, through squash, the
    weighted sum, the softmax, and the logits' update that fed the next."""
    axis = -2 if over_inputs else -1
    logits = votes.new_zeros(votes.shape[:-1])
    states: List[Tuple[Tensor, Tensor, Tensor]] = []
    for step in range(iterations):
        states.append(iteration(logits, votes, over_inputs))
        logits = logits + (states[-1][2].unsqueeze(-3) * votes).sum(dim=-1)
    grad_omega = grad.float()
    grad_votes = torch.zeros_like(votes)
    grad_logits = torch.zeros_like(logits)
    for step in reversed(range(iterations)):
        agreement, total, omega = states[step]
        if step + 1 < iterations:  # B_{t+1} = B_t + Omega_t . V
            grad_omega = (grad_logits.unsqueeze(-1) * votes).sum(dim=-3)
            grad_votes += grad_logits.unsqueeze(-1) * omega.unsqueeze(-3)
        sq_norm = total.square().sum(-1, keepdim=True)
        factor = sq_norm / (1.0 + sq_norm) / torch.sqrt(sq_norm + ROUTING_EPS)
        grad_total = grad_omega * factor + 2.0 * total * (grad_omega * total).sum(-1, keepdim=True) \
            * squash_derivative(sq_norm)
        grad_agreement = (grad_total.unsqueeze(-3) * votes).sum(-1)
        grad_votes += agreement.unsqueeze(-1) * grad_total.unsqueeze(-3)
        grad_logits = grad_logits + agreement * (grad_agreement
                                                 - (agreement * grad_agreement).sum(axis, keepdim=True))
    return grad_votes


@torch.library.custom_op("capsagg::dynamic_route", mutates_args=())
def _fused(votes: Tensor, iterations: int, over_inputs: bool) -> Tensor:
    kernels = triton_kernels(__name__, votes)
    if kernels is not None:
        return kernels.forward(votes, iterations, over_inputs)
    return routing_iterations(votes.float(), iterations, over_inputs)


@_fused.register_fake
def _(votes: Tensor, iterations: int, over_inputs: bool) -> Tensor:
    return votes.new_empty(votes.size(0), *votes.shape[2:], dtype=torch.float32)


@torch.library.custom_op("capsagg::dynamic_route_backward", mutates_args=())
def _fused_backward(grad: Tensor, votes: Tensor, iterations: int, over_inputs: bool) -> Tensor:
    kernels = triton_kernels(__name__, votes)
    if kernels is not None:
        return kernels.backward(grad, votes, iterations, over_inputs)
    return reference_backward(grad, votes.float(), iterations, over_inputs).to(votes.dtype)


@_fused_backward.register_fake
def _(grad: Tensor, votes: Tensor, iterations: int, over_inputs: bool) -> Tensor:
    return torch.empty_like(votes)


def _setup_context(ctx, inputs: Tuple[Tensor, int, bool], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.iterations, ctx.over_inputs = inputs[1], inputs[2]


def _backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], None, None]:
    (votes,) = ctx.saved_tensors
    return _fused_backward(grad.contiguous(), votes, ctx.iterations, ctx.over_inputs), None, None


_fused.register_autograd(_backward, setup_context=_setup_context)


def dynamic_route(votes: Tensor, iterations: int, over_inputs: bool, kernel: str = "auto") -> Tensor:
    """:func:`routing_iterations` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`), in fp32 for votes
    (..., L, N, D) of any precision: the output capsules (..., N, D), fp32. The fused operator reads the votes in
    place and saves them as they are for its backward (:func:`..numerics.votes_by_position`); the loop routes an fp32
    copy."""
    if not runs_fused(kernel, votes):
        return routing_iterations(votes.float(), iterations, over_inputs)
    out = _fused(votes_by_position(votes), iterations, over_inputs)
    return out.view(*votes.shape[:-3], *votes.shape[-2:])
