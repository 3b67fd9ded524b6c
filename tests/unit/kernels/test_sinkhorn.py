"""The Sinkhorn-Knopp kernels (``aggregators/kernels/sinkhorn.py``) against the eager loop (``aggregators/ops/sinkhorn.py``):
the doubly stochastic matrices, mHC's blended mix and their gradients."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import sinkhorn as sinkhorn_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops.sinkhorn import mix_reference, sinkhorn_reference  # noqa: E402
from kernel_cases import DEVICE, TOLERANCE  # noqa: E402


@pytest.mark.parametrize("positions,n,iterations", [(37, 4, 20), (5, 3, 7), (sinkhorn_triton.BLOCK, 2, 1)])
def test_the_kernels_compute_the_loops_matrices_and_gradient(positions, n, iterations):
    generator = torch.Generator().manual_seed(positions + n)
    logits = (3 * torch.randn(positions, n, n, generator=generator)).to(DEVICE).requires_grad_()
    grad = torch.randn(positions, n, n, generator=generator).to(DEVICE)
    expected = sinkhorn_reference(logits, iterations)
    (expected_grad,) = torch.autograd.grad(expected, logits, grad)
    got = sinkhorn_triton.forward(logits.detach(), iterations)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    torch.testing.assert_close(sinkhorn_triton.backward(logits.detach(), grad, iterations), expected_grad, **TOLERANCE)
    assert torch.allclose(got.sum(-1), torch.ones(positions, n, device=DEVICE), atol=1e-5)  # rows sum to one


def test_a_wrong_kernel_is_caught():
    """One iteration fewer is far outside the tolerance: the comparison above can fail."""
    logits = (3 * torch.randn(8, 4, 4, generator=torch.Generator().manual_seed(0))).to(DEVICE)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(sinkhorn_triton.forward(logits, 2), sinkhorn_reference(logits, 3), **TOLERANCE)


def test_the_transposing_sinkhorn_kernels_compute_mhcs_mix_and_gradient():
    """P^T (mHC's H_res as mixing rows, no gate) and the logits' gradient."""
    generator = torch.Generator().manual_seed(6)
    logits = (3 * torch.randn(37, 4, 4, generator=generator)).to(DEVICE).requires_grad_()
    grad = torch.randn(37, 4, 4, generator=generator).to(DEVICE)
    expected = mix_reference(logits, None, 20)
    (expected_grad,) = torch.autograd.grad(expected, logits, grad)
    got = sinkhorn_triton.forward(logits.detach(), 20, transposed=True)
    torch.testing.assert_close(got, expected, **TOLERANCE)
    torch.testing.assert_close(got.sum(-2), torch.ones(37, 4, device=DEVICE), rtol=0, atol=1e-5)  # each new stream's
    got_grad, no_gate = sinkhorn_triton.backward(logits.detach(), grad, 20, transposed=True)
    torch.testing.assert_close(got_grad, expected_grad, rtol=1e-5, atol=1e-5)
    assert no_gate.numel() == 0


@pytest.mark.parametrize("gate", [0.4, -0.3])
def test_the_blending_sinkhorn_kernels_compute_mhcs_mix_and_gradients(gate):
    """I + g (P^T - I) and the gradients of the logits and the gate (the identity through the clamp)."""
    generator = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(37, 4, 4, generator=generator)).to(DEVICE).requires_grad_()
    gate = torch.tensor(gate, device=DEVICE, requires_grad=True)
    grad = torch.randn(37, 4, 4, generator=generator).to(DEVICE)
    expected = mix_reference(logits, gate, 20)
    expected_grads = torch.autograd.grad(expected, (logits, gate), grad)
    torch.testing.assert_close(sinkhorn_triton.forward(logits.detach(), 20, gate.detach()), expected, **TOLERANCE)
    for got, want in zip(sinkhorn_triton.backward(logits.detach(), grad, 20, gate.detach()), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
