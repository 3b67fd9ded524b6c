"""MUDD's kernels (``aggregators/kernels/mudd_aggregate.py``) against the reference (``aggregators/ops/mudd_aggregate.py``), and the
bf16 weights of both dense-connection kernels read as their fp32 values."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import depth_softmax as depth_softmax_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import mudd_aggregate as mudd_aggregate_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.mudd_aggregate import aggregate_reference as mudd_aggregate_reference  # noqa: E402
from fairseq_capsagg.aggregators.ops.mudd_aggregate import saved_sums  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


@pytest.mark.parametrize("num_layers,streams,hidden,positions,channels", [(5, 4, 20, 7, 70), (3, 1, 3, 9, 40),
                                                                          (2, 4, 8, mudd_aggregate_triton.BLOCK_P, 8)])
def test_the_mudd_kernels_compute_the_references_aggregates_and_gradients(num_layers, streams, hidden, positions,
                                                                         channels):
    generator = torch.Generator().manual_seed(num_layers + hidden)
    shapes = [(num_layers, positions, channels), (hidden, channels), (streams * num_layers, hidden),
              (streams, num_layers)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    grad = torch.randn(streams, positions, channels, generator=generator).to(DEVICE)
    expected = mudd_aggregate_reference(*leaves)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    inputs = [leaf.detach() for leaf in leaves]
    out, *saved = mudd_aggregate_triton.forward(*inputs, RMS_EPS)
    for got, want in zip((out, *saved), (expected, *saved_sums(inputs[0], inputs[1]))):  # and what backward reads
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for got, want in zip(mudd_aggregate_triton.backward(grad, *inputs, *saved), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # the layers' gradient added to what the target holds
    held = torch.randn(inputs[0].shape, generator=generator).to(DEVICE)
    target = held.clone()
    mudd_aggregate_triton.backward(grad, *inputs, *saved, grad_layers=target, accumulate=True)
    torch.testing.assert_close(target, held + expected_grads[0], rtol=1e-4, atol=1e-4)


def test_the_mudd_kernel_keeps_the_identity_start_exact():
    """W_2 = 0 and b one-hot on H^L: every stream is exactly H^L."""
    layers = torch.randn(3, 5, 16).to(DEVICE)
    static = torch.zeros(4, 3, device=DEVICE)
    static[:, -1] = 1.0
    got, _, _ = mudd_aggregate_triton.forward(layers, torch.randn(12, 16).to(DEVICE),
                                              torch.zeros(12, 12, device=DEVICE), static, RMS_EPS)
    assert torch.equal(got, layers[-1].expand(4, 5, 16))


@pytest.mark.parametrize("kernels", ["depth softmax, static query", "depth softmax, query per position", "mudd"])
def test_the_dense_connection_kernels_read_bf16_weights_as_their_fp32_values(kernels):
    """Attention over depth's query and gate and MUDD's MLP in a bf16 model's precision: upcast as they are loaded,
    the outputs those of their fp32 values exactly, each gradient theirs rounded once to bf16."""
    generator = torch.Generator().manual_seed(47)
    layers = torch.randn(4, 9, 70, generator=generator).to(DEVICE)
    grad_shape = (3, 9, 70) if kernels == "mudd" else (9, 70)
    grad = torch.randn(grad_shape, generator=generator).to(DEVICE)
    module, shapes = ((mudd_aggregate_triton, [(5, 70), (12, 5), (3, 4)]) if kernels == "mudd" else
                      (depth_softmax_triton, [(70,) if "static" in kernels else (9, 70), ()]))
    weights = [torch.randn(shape, generator=generator).to(torch.bfloat16).to(DEVICE) for shape in shapes]
    exact = [w.float() for w in weights]
    if kernels == "mudd":  # the forward also returns what the backward reads, the same for both
        out, *saved = module.forward(layers, *weights, RMS_EPS)
        exact_out, *exact_saved = module.forward(layers, *exact, RMS_EPS)
        for got_saved, want_saved in zip(saved, exact_saved):
            torch.testing.assert_close(got_saved, want_saved, rtol=0, atol=0)
        got, want = module.backward(grad, layers, *weights, *saved), module.backward(grad, layers, *exact, *saved)
    else:
        out, exact_out = module.forward(layers, *weights, RMS_EPS), module.forward(layers, *exact, RMS_EPS)
        got, want = module.backward(grad, layers, *weights, RMS_EPS), module.backward(grad, layers, *exact, RMS_EPS)
    torch.testing.assert_close(out, exact_out, rtol=0, atol=0)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for index, (got_grad, want_grad) in enumerate(zip(got[1:], want[1:])):
        assert got_grad.dtype == torch.bfloat16
        # a query per position's gradient is rounded by the kernel as it stores it (Triton's interpreter rounds
        # towards zero, torch to nearest): one bf16 step apart at most; the others are rounded by torch, exactly
        rounded_by_kernel = index == 0 and kernels == "depth softmax, query per position"
        torch.testing.assert_close(got_grad, want_grad.to(torch.bfloat16), rtol=2 ** -7 if rounded_by_kernel else 0,
                                   atol=0)
