"""Hyper-connections' read kernels (``aggregators/kernels/hyper_read.py``) against the reference read (``aggregators/ops/hyper_read.py``): read weights and gradients, bf16 weights, the identity start."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import hyper_read as hyper_read_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.hyper_read import read_reference, saved_sums  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


@pytest.mark.parametrize("positions,n,channels", [(9, 4, 70), (hyper_read_triton.BLOCK_P, 3, 130), (3, 1, 8)])
def test_the_hyper_read_kernels_compute_the_references_read_weights_and_gradients(positions, n, channels):
    generator = torch.Generator().manual_seed(positions + n)
    shapes = [(positions, n, channels), (n + 2, channels), (n,), (n, n), (n,), (), ()]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((positions, channels),
                                                                             (positions, n, n), (positions, n))]
    expected = read_reference(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    inputs = [leaf.detach().contiguous() for leaf in leaves]
    outputs = hyper_read_triton.forward(*inputs, RMS_EPS)
    for got, want in zip(outputs, (*expected, *saved_sums(inputs[0], inputs[1]))):  # D and 1/RMS too
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = hyper_read_triton.backward(*grads, inputs[0], inputs[1], inputs[2], inputs[5], inputs[6], *outputs[3:])
    for got, want in zip(got_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_hyper_read_kernels_read_bf16_weights_as_their_fp32_values():
    """A bf16 model's weights go in as they are: the kernels upcast them as they load them, so the outputs are the
    ones of their fp32 values exactly, and each weight's gradient is theirs rounded once to bf16."""
    generator = torch.Generator().manual_seed(41)
    n, channels = 3, 70
    shapes = [(n + 2, channels), (n,), (n, n), (n,), (), ()]
    weights = [torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE) for shape in shapes]
    streams = torch.randn(6, n, channels, generator=generator).to(DEVICE)
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((6, channels), (6, n, n), (6, n))]
    exact = [w.float() for w in weights]
    outputs = hyper_read_triton.forward(streams, *weights, RMS_EPS)
    for got, want in zip(outputs, hyper_read_triton.forward(streams, *exact, RMS_EPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    read_by_backward = (0, 1, 4, 5)  # W, A_m, s_a, s_b
    got = hyper_read_triton.backward(*grads, streams, *(weights[i] for i in read_by_backward), *outputs[3:])
    want = hyper_read_triton.backward(*grads, streams, *(exact[i] for i in read_by_backward), *outputs[3:])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for got_grad, want_grad in zip(got[1:], want[1:]):
        assert got_grad.dtype == torch.bfloat16
        torch.testing.assert_close(got_grad, want_grad.to(torch.bfloat16), rtol=0, atol=0)


def test_the_hyper_read_kernel_keeps_the_identity_start_exact():
    """W = 0: a is one-hot, so h is exactly the home stream, r = A_r and b = B."""
    streams = torch.randn(5, 4, 16).to(DEVICE)
    read = torch.zeros(4, device=DEVICE)
    read[2] = 1.0
    h, mix, write, _, _ = hyper_read_triton.forward(streams, torch.zeros(6, 16, device=DEVICE), read,
                                              torch.eye(4, device=DEVICE), torch.ones(4, device=DEVICE),
                                              torch.tensor(0.01, device=DEVICE), torch.tensor(0.01, device=DEVICE),
                                              RMS_EPS)
    assert torch.equal(h, streams[:, 2]) and torch.equal(mix, torch.eye(4, device=DEVICE).expand(5, 4, 4))
    assert torch.equal(write, torch.ones(5, 4, device=DEVICE))
