"""EM routing's input-activation kernels (``aggregators/kernels/input_activation.py``) against the reference (``aggregators/ops/input_activation.py``)."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import input_activation as input_activation_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops.input_activation import activation_reference  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


@pytest.mark.parametrize("positions,layers,channels", [(37, 7, 70), (input_activation_triton.BLOCK_P, 3, 64),
                                                       (5, 1, 9)])
def test_the_input_activation_kernels_compute_the_references_activations_and_gradients(positions, layers, channels):
    generator = torch.Generator().manual_seed(positions + layers)
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_()
              for shape in ((positions, layers, channels), (layers, channels), (layers,))]
    grad = torch.randn(positions, layers, generator=generator).to(DEVICE)
    expected = activation_reference(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    inputs = [leaf.detach() for leaf in leaves]
    got = input_activation_triton.forward(*inputs)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for got_grad, want in zip(input_activation_triton.backward(grad, got, *inputs), expected_grads):
        torch.testing.assert_close(got_grad, want, rtol=1e-5, atol=1e-5)


def test_the_input_activation_kernels_read_bf16_capsules_and_weights_as_their_fp32_values():
    """The same outputs as from fp32 copies of the same values, bit for bit; the gradients in bf16, each the fp32
    copies' rounded once (the capsules' inside the kernel, within one bf16 step: the interpreter rounds toward
    zero)."""
    generator = torch.Generator().manual_seed(3)
    inputs = [torch.randn(shape, generator=generator).to(DEVICE).to(torch.bfloat16) for shape in ((9, 5, 40), (5, 40),
                                                                                                 (5,))]
    exact = [x.float() for x in inputs]
    act = input_activation_triton.forward(*inputs)
    assert torch.equal(act, input_activation_triton.forward(*exact))
    grad = torch.randn(9, 5, generator=generator).to(DEVICE)
    got = input_activation_triton.backward(grad, act, *inputs)
    want = input_activation_triton.backward(grad, act, *exact)
    assert all(g.dtype == torch.bfloat16 for g in got)
    torch.testing.assert_close(got[0].float(), want[0], rtol=2 ** -7, atol=0)
    for got_grad, want_grad in zip(got[1:], want[1:]):
        assert torch.equal(got_grad, want_grad.to(torch.bfloat16))
