"""mHC's read kernels (``aggregators/kernels/mhc_read.py``) against the reference read (``aggregators/ops/mhc_read.py``): read logits and gradients, bf16 weights."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import mhc_read as mhc_read_triton, sinkhorn as sinkhorn_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.mhc_read import read_reference as mhc_read_reference  # noqa: E402
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
    for got, want in zip(mhc_read_triton.forward(*inputs, home, shared, RMS_EPS), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = mhc_read_triton.backward(*grads, *inputs[:4], *inputs[5:], home, shared, RMS_EPS)
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
    for got, want in zip(mhc_read_triton.forward(streams, *weights, home, True, RMS_EPS),
                         mhc_read_triton.forward(streams, *exact, home, True, RMS_EPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    read_by_backward = (0, 1, 2, 4, 5)  # phi, b_pre, b_post, alpha, the gate
    got = mhc_read_triton.backward(*grads, streams, *(weights[i] for i in read_by_backward), home, True, RMS_EPS)
    want = mhc_read_triton.backward(*grads, streams, *(exact[i] for i in read_by_backward), home, True, RMS_EPS)
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
