"""Sinkhorn-Knopp for mHC's H_res, alone or with mHC's blend from the identity: the eager loop (the reference) or
one fused operator each way.

``--connection-kernels`` picks the implementation (:func:`.dispatch.runs_fused`); both compute the same matrices and
gradients:

* fused: ``capsagg::sinkhorn`` or ``capsagg::mhc_mix`` and its backward; on CUDA with Triton one kernel each
  (:mod:`..kernels.sinkhorn`), elsewhere the eager loop (and :func:`reference_backward`) inside the operator;
* eager: the loop of :func:`sinkhorn_reference`, 2T log-sum-exps of small tensors (hundreds of kernels a
  block on a GPU).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .dispatch import runs_fused, triton_kernels
from .mhc_read import clamped_gate

#: Sinkhorn-Knopp iterations of H_res (the paper's).
SINKHORN_ITERATIONS = 20


def sinkhorn_reference(logits: Tensor, iterations: int = SINKHORN_ITERATIONS) -> Tensor:
    """The doubly stochastic matrix of Sinkhorn-Knopp from exp(logits) over the last two dimensions, in fp32
    and in log space, with autocast off: columns, then rows, normalised ``iterations`` times, so the rows
    (each output stream's weights) sum to 1 to rounding and the columns to the method's convergence.

    The n x n matrices of all positions are laid out matrix entry first, (n, n, positions), so that each
    normalisation reduces over an outer dimension (sums of contiguous slabs) rather than over a stride of
    n inside every position: the same operations and values, 1.7x faster on a CPU at n = 4."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        shape = logits.shape
        log_p = logits.float().reshape(-1, *shape[-2:]).permute(1, 2, 0).contiguous()
        for _ in range(iterations):
            log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)  # each column over its rows
            log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)  # each row over its columns
        return log_p.exp().permute(2, 0, 1).contiguous().view(shape)  # each position's matrix contiguous again


def reference_backward(logits: Tensor, grad: Tensor, iterations: int = SINKHORN_ITERATIONS) -> Tensor:
    """The gradient of :func:`sinkhorn_reference` at ``logits`` (P, n, n) given ``grad`` of its output, written
    out: back through exp, then through every normalisation y = x - logsumexp(x), whose gradient is
    g - softmax(x) sum(g) with softmax(x) = exp(y), in reverse (autograd's values, without its graph)."""
    log_p = logits.float().permute(1, 2, 0).contiguous()
    steps = []
    for _ in range(iterations):
        log_p = log_p - torch.logsumexp(log_p, dim=0, keepdim=True)
        steps.append(log_p)
        log_p = log_p - torch.logsumexp(log_p, dim=1, keepdim=True)
        steps.append(log_p)
    g = grad.float().permute(1, 2, 0) * log_p.exp()
    for index in reversed(range(len(steps))):
        g = g - steps[index].exp() * g.sum(dim=index % 2, keepdim=True)
    return g.permute(2, 0, 1).contiguous()


@torch.library.custom_op("capsagg::sinkhorn", mutates_args=())
def _fused(logits: Tensor, iterations: int) -> Tensor:
    kernels = triton_kernels(__name__, logits)
    if kernels is not None:
        return kernels.forward(logits, iterations)
    return sinkhorn_reference(logits, iterations)


@_fused.register_fake
def _(logits: Tensor, iterations: int) -> Tensor:
    return torch.empty_like(logits)


@torch.library.custom_op("capsagg::sinkhorn_backward", mutates_args=())
def _fused_backward(logits: Tensor, grad: Tensor, iterations: int) -> Tensor:
    kernels = triton_kernels(__name__, logits)
    if kernels is not None:
        return kernels.backward(logits, grad, iterations)
    return reference_backward(logits, grad, iterations)


@_fused_backward.register_fake
def _(logits: Tensor, grad: Tensor, iterations: int) -> Tensor:
    return torch.empty_like(logits)


def _setup_context(ctx, inputs: Tuple[Tensor, int], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.iterations = inputs[1]


def _backward(ctx, grad: Tensor) -> Tuple[Tensor, None]:
    (logits,) = ctx.saved_tensors
    return _fused_backward(logits, grad.contiguous(), ctx.iterations), None


_fused.register_autograd(_backward, setup_context=_setup_context)


def sinkhorn_fused(logits: Tensor, iterations: int = SINKHORN_ITERATIONS) -> Tensor:
    """:func:`sinkhorn_reference` as one operator forward and one backward (``capsagg::sinkhorn``)."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        shape = logits.shape
        flat = logits.float().reshape(-1, *shape[-2:]).contiguous()
        return _fused(flat, iterations).view(shape)


def sinkhorn(logits: Tensor, iterations: int = SINKHORN_ITERATIONS, kernel: str = "auto") -> Tensor:
    """Sinkhorn-Knopp by the implementation ``kernel`` (:func:`.dispatch.runs_fused`; the same values)."""
    if runs_fused(kernel, logits):
        return sinkhorn_fused(logits, iterations)
    return sinkhorn_reference(logits, iterations)


def mix_reference(logits: Tensor, gate: Optional[Tensor], iterations: int = SINKHORN_ITERATIONS) -> Tensor:
    """mHC's H_res as mixing rows (stream i into stream j), P^T with P = :func:`sinkhorn_reference` of ``logits``
    (..., n, n), contiguous; with a ``gate`` (a checkpoint of the start before, :mod:`..methods.mhc`)
    I + g (P^T - I) with g = clamp(gate, 0, 1) (the identity backward): doubly stochastic for g in [0, 1]."""
    if gate is None:
        return sinkhorn_reference(logits, iterations).transpose(-1, -2).contiguous()
    identity = torch.eye(logits.size(-1), device=logits.device)
    return identity + clamped_gate(gate) * (sinkhorn_reference(logits, iterations).transpose(-1, -2) - identity)


def mix_reference_backward(logits: Tensor, gate: Optional[Tensor], grad: Tensor,
                           iterations: int = SINKHORN_ITERATIONS) -> Tuple[Tensor, Tensor]:
    """The gradients of :func:`mix_reference`'s logits (P, n, n) and gate (in its precision; without a gate, an empty
    tensor) given ``grad`` of its output."""
    grad = grad.float().transpose(-1, -2)
    if gate is None:
        return reference_backward(logits, grad, iterations), logits.new_empty(0)
    identity = torch.eye(logits.size(-1), device=logits.device)
    grad_gate = (grad * (sinkhorn_reference(logits, iterations) - identity)).sum()
    return reference_backward(logits, gate.float().clamp(0.0, 1.0) * grad, iterations), grad_gate.to(gate.dtype)


@torch.library.custom_op("capsagg::mhc_mix", mutates_args=())
def _mix_fused(logits: Tensor, gate: Optional[Tensor], iterations: int) -> Tensor:
    kernels = triton_kernels(__name__, logits)
    if kernels is not None:
        return kernels.forward(logits, iterations, gate, transposed=True)
    return mix_reference(logits, gate, iterations)


@_mix_fused.register_fake
def _(logits: Tensor, gate: Optional[Tensor], iterations: int) -> Tensor:
    return torch.empty_like(logits)


@torch.library.custom_op("capsagg::mhc_mix_backward", mutates_args=())
def _mix_fused_backward(logits: Tensor, gate: Optional[Tensor], grad: Tensor,
                        iterations: int) -> Tuple[Tensor, Tensor]:
    kernels = triton_kernels(__name__, logits)
    if kernels is not None:
        return kernels.backward(logits, grad, iterations, gate, transposed=True)
    return mix_reference_backward(logits, gate, grad, iterations)


@_mix_fused_backward.register_fake
def _(logits: Tensor, gate: Optional[Tensor], grad: Tensor, iterations: int) -> Tuple[Tensor, Tensor]:
    return torch.empty_like(logits), logits.new_empty(0) if gate is None else torch.empty_like(gate)


def _mix_setup_context(ctx, inputs: Tuple[Tensor, Optional[Tensor], int], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.iterations = inputs[2]


def _mix_backward(ctx, grad: Tensor) -> Tuple[Tensor, Optional[Tensor], None]:
    logits, gate = ctx.saved_tensors
    grad_logits, grad_gate = _mix_fused_backward(logits, gate, grad.contiguous(), ctx.iterations)
    return grad_logits, None if gate is None else grad_gate, None


_mix_fused.register_autograd(_mix_backward, setup_context=_mix_setup_context)


def mhc_mix(logits: Tensor, gate: Optional[Tensor], iterations: int = SINKHORN_ITERATIONS,
            kernel: str = "auto") -> Tensor:
    """:func:`mix_reference` by the implementation ``kernel`` (:func:`.dispatch.runs_fused`): fused, Sinkhorn-Knopp,
    the transpose and any blend as one operator each way (``capsagg::mhc_mix``), which reads a gate in its
    precision."""
    if not runs_fused(kernel, logits):
        return mix_reference(logits, gate, iterations)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        shape = logits.shape
        flat = logits.float().reshape(-1, *shape[-2:]).contiguous()
        return _mix_fused(flat, gate, iterations).view(shape)
