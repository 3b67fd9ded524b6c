"""The fused Sinkhorn's Triton kernels (one each way on CUDA) against the eager loop: on a GPU, and without one
in Triton's interpreter on CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``): values and gradients,
padded matrix sizes, partial blocks."""

import os

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators import sinkhorn_triton  # noqa: E402 (needs Triton)
from fairseq_capsagg.aggregators.sinkhorn import _triton_kernels, sinkhorn_reference  # noqa: E402

#: The kernels and the loop both sum in fp32, in another order.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


#: Where the kernels run: the GPU, or the interpreter's CPU tensors.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_without_a_gpu_the_kernels_run_in_the_interpreter():
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


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


def test_the_fused_operator_computes_the_loops_matrices_on_every_device():
    """On CUDA it launches the kernels; on the CPU it runs the loop (Triton compiles for GPUs)."""
    assert _triton_kernels() is sinkhorn_triton
    logits = torch.randn(3, 4, 4, device=DEVICE)
    torch.testing.assert_close(torch.ops.capsagg.sinkhorn(logits, 5), sinkhorn_reference(logits, 5), **TOLERANCE)
