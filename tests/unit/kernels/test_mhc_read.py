"""mHC's read kernels (``aggregators/kernels/mhc_read.py``) against the reference read (``aggregators/ops/mhc_read.py``): read logits and gradients, bf16 weights."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import mhc_read as mhc_read_triton, sinkhorn as sinkhorn_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.mhc_read import read_reference as mhc_read_reference  # noqa: E402
from fairseq_capsagg.aggregators.ops.mhc_read import saved_sums  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


@pytest.mark.parametrize("positions,n,channels,home", [(9, 4, 40, 2), (mhc_read_triton.BLOCK_P, 3, 20, 0),
                                                       (3, 2, 8, 1)])
@pytest.mark.parametrize("gate,shared", [(0.6, False), (1.3, True)])
def test_the_mhc_read_kernels_compute_the_references_read_logits_and_gradients(positions, n, channels, home, gate,
                                                                             shared):
    """The mended start's H_post (ungated) and a checkpoint's of the start before (gated), there with the gate above
    its clamp, where its gradient passes through as through the identity."""
    generator = torch.Generator().manual_seed(positions + n)
    shapes = [(positions, n, channels), (2 * n + n * n, n * channels), (n,), (n,), (n, n), (3,)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    leaves.append(torch.tensor(gate, device=DEVICE, requires_grad=True))
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((positions, channels),
                                                                             (positions, n, n), (positions, n))]
    expected = mhc_read_reference(*leaves, home, shared)
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    inputs = [leaf.detach().contiguous() for leaf in leaves]
    outputs = mhc_read_triton.forward(*inputs, home, shared, RMS_EPS)
    for got, want in zip(outputs, (*expected, *saved_sums(inputs[0], inputs[1]))):  # D and 1/RMS too
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = mhc_read_triton.backward(*grads, *inputs[:4], *inputs[5:], *outputs[3:], home, shared)
    for got, want in zip(got_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_mhc_kernels_read_bf16_weights_as_their_fp32_values():
    """As the hyper-connection's: mHC's read and its blend upcast a bf16 model's weights as they load them; each
    weight's gradient is the fp32 one rounded once to bf16."""
    generator = torch.Generator().manual_seed(43)
    n, channels, home = 3, 20, 1
    shapes = [(2 * n + n * n, n * channels), (n,), (n,), (n, n), (3,), ()]
    weights = [torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE) for shape in shapes]
    streams = torch.randn(6, n, channels, generator=generator).to(DEVICE)
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((6, channels), (6, n, n), (6, n))]
    exact = [w.float() for w in weights]
    outputs = mhc_read_triton.forward(streams, *weights, home, True, RMS_EPS)
    for got, want in zip(outputs, mhc_read_triton.forward(streams, *exact, home, True, RMS_EPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    read_by_backward = (0, 1, 2, 4, 5)  # phi, b_pre, b_post, alpha, the gate
    got = mhc_read_triton.backward(*grads, streams, *(weights[i] for i in read_by_backward), *outputs[3:], home, True)
    want = mhc_read_triton.backward(*grads, streams, *(exact[i] for i in read_by_backward), *outputs[3:], home, True)
    logits, mix_grad = grads[1], torch.randn(6, n, n, generator=generator).to(DEVICE)
    torch.testing.assert_close(sinkhorn_triton.forward(logits, 20, weights[-1]),
                               sinkhorn_triton.forward(logits, 20, exact[-1]), rtol=0, atol=0)
    got = (*got, *sinkhorn_triton.backward(logits, mix_grad, 20, weights[-1]))
    want = (*want, *sinkhorn_triton.backward(logits, mix_grad, 20, exact[-1]))
    for index, (got_grad, want_grad) in enumerate(zip(got, want)):
        if index in (0, 7):  # the streams' and the logits' gradients, fp32
            torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)
        else:
            assert got_grad.dtype == torch.bfloat16, index
            torch.testing.assert_close(got_grad, want_grad.to(torch.bfloat16), rtol=0, atol=0)


def test_a_bf16_models_products_run_in_tf32_and_equal_the_fp32_reference():
    """Streams and phi both bf16 (a bf16 model): the forward's projection runs as a TF32 tile product, which holds bf16
    values exactly, so D equals the reference's on the same values; the backward's gradients the reference's rounded
    to bf16."""
    generator = torch.Generator().manual_seed(47)
    n, channels, home, positions = 4, 24, 3, 20
    shapes = [(positions, n, channels), (2 * n + n * n, n * channels), (n,), (n,), (n, n), (3,)]
    leaves = [torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE) for shape in shapes]
    leaves[-1] = leaves[-1].abs()  # alphas that let the dynamic logits matter
    leaves.append(torch.tensor(0.7, dtype=torch.bfloat16, device=DEVICE))
    exact = [leaf.float().requires_grad_() for leaf in leaves]
    expected = mhc_read_reference(*exact, home, False)
    outputs = mhc_read_triton.forward(*leaves, home, False, RMS_EPS)
    want_outputs = (*expected, *saved_sums(exact[0].detach(), exact[1].detach()))
    # h in bf16 to its rounding (the reference weighs in bf16, the kernel in fp32); the fp32 outputs, D among them,
    # to the sums' order
    torch.testing.assert_close(outputs[0].float(), want_outputs[0].float(), rtol=1.6e-2, atol=1e-2)
    for got, want in zip(outputs[1:], want_outputs[1:]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    grads = [torch.randn(out.shape, generator=generator).to(DEVICE) for out in expected]
    expected_grads = torch.autograd.grad(expected, exact, grads)
    got_grads = mhc_read_triton.backward(grads[0].to(torch.bfloat16), *grads[1:], *leaves[:4], *leaves[5:],
                                         *outputs[3:], home, False)
    for got, want in zip(got_grads, expected_grads):
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_the_mhc_read_kernels_compute_h_res_logits_of_any_width():
    """H_res's logits as many as its parameters: mHC-lite's n! = 6 weights of the permutations at n = 3, in one
    vector (mHC's are its n x n entries)."""
    generator = torch.Generator().manual_seed(53)
    positions, n, channels, width = 11, 3, 24, 6
    shapes = [(positions, n, channels), (2 * n + width, n * channels), (n,), (n,), (width,), (3,)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    leaves.append(torch.tensor(0.6, device=DEVICE, requires_grad=True))
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((positions, channels),
                                                                             (positions, width), (positions, n))]
    expected = mhc_read_reference(*leaves, 1, False)
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    inputs = [leaf.detach().contiguous() for leaf in leaves]
    outputs = mhc_read_triton.forward(*inputs, 1, False, RMS_EPS)
    assert outputs[1].shape == (positions, width)
    for got, want in zip(outputs, (*expected, *saved_sums(inputs[0], inputs[1]))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = mhc_read_triton.backward(*grads, *inputs[:4], *inputs[5:], *outputs[3:], 1, False)
    assert got_grads[4].shape == (width,)
    for got, want in zip(got_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
