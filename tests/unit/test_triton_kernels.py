"""The fused operators' Triton kernels (one each way on CUDA) against their eager references: on a GPU, and
without one in Triton's interpreter on CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``): values and
gradients, padded sizes, partial blocks."""

import os

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators import norm_linear_triton, sinkhorn_triton, stream_write_triton  # noqa: E402
from fairseq_capsagg.aggregators.fused import triton_kernels  # noqa: E402
from fairseq_capsagg.aggregators.norm_linear import norm_linear_reference  # noqa: E402
from fairseq_capsagg.aggregators.normalisation import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.sinkhorn import sinkhorn_reference  # noqa: E402
from fairseq_capsagg.aggregators.stream_write import write_reference  # noqa: E402

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


def test_the_fused_operators_take_the_kernels_on_cuda_and_the_references_elsewhere():
    logits = torch.randn(3, 4, 4, device=DEVICE)
    assert (triton_kernels("sinkhorn_triton", logits) is sinkhorn_triton) == (DEVICE == "cuda")
    assert triton_kernels("stream_write_triton", logits.cpu()) is None
    torch.testing.assert_close(torch.ops.capsagg.sinkhorn(logits, 5), sinkhorn_reference(logits, 5), **TOLERANCE)


@pytest.mark.parametrize("positions,n,channels", [(13, 4, 70), (5, 3, stream_write_triton.BLOCK_C),
                                                  (stream_write_triton.BLOCK_P, 1, 9)])
def test_the_write_kernels_compute_the_references_streams_and_gradients(positions, n, channels):
    generator = torch.Generator().manual_seed(positions + n)
    shapes = [(positions, n, channels), (positions, n, n), (positions, n), (positions, channels), (positions, channels)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    grad = torch.randn(positions, n, channels, generator=generator).to(DEVICE)
    expected = write_reference(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    inputs = [leaf.detach() for leaf in leaves]
    torch.testing.assert_close(stream_write_triton.forward(*inputs), expected, **TOLERANCE)
    grad_streams, grad_mix, grad_write, grad_increment = stream_write_triton.backward(grad, *inputs)
    for got, want in zip((grad_streams, grad_mix, grad_write, -grad_increment, grad_increment), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_write_kernel_keeps_the_identity_start_exact():
    h, y = torch.randn(6, 16).to(DEVICE), torch.randn(6, 16).to(DEVICE)
    streams = h.unsqueeze(1).expand(6, 4, 16).contiguous()
    mix, write = torch.eye(4).expand(6, 4, 4).contiguous().to(DEVICE), torch.ones(6, 4).to(DEVICE)
    assert torch.equal(stream_write_triton.forward(streams, mix, write, h, y), y.unsqueeze(1).expand(6, 4, 16))


@pytest.mark.parametrize("rows,width,outputs,tanh", [(37, 70, 6, True), (5, 130, 24, False),
                                                     (norm_linear_triton.BLOCK_R, 64, 1, True)])
def test_the_dynamic_weight_kernels_compute_the_references_projection_and_gradients(rows, width, outputs, tanh):
    generator = torch.Generator().manual_seed(rows + width)
    x = (2 * torch.randn(rows, width, generator=generator)).to(DEVICE).requires_grad_()
    weight = torch.randn(outputs, width, generator=generator).to(DEVICE).requires_grad_()
    grad = torch.randn(rows, outputs, generator=generator).to(DEVICE)
    expected = norm_linear_reference(x, weight, tanh)
    expected_grads = torch.autograd.grad(expected, (x, weight), grad)
    got = norm_linear_triton.forward(x.detach(), weight.detach(), RMS_EPS, tanh)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for got_grad, want in zip(norm_linear_triton.backward(grad, x.detach(), weight.detach(), got, RMS_EPS, tanh),
                              expected_grads):
        torch.testing.assert_close(got_grad, want, rtol=1e-5, atol=2e-5)
