"""Attention over depth's kernels (``aggregators/kernels/depth_softmax.py``) against the reference (``aggregators/ops/depth_softmax.py``), and the
backward's writing or adding into a dense connection's gradient buffer, which MUDD's kernels share."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import depth_softmax as depth_softmax_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import mudd_aggregate as mudd_aggregate_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.depth_softmax import aggregate_reference as depth_aggregate_reference  # noqa: E402
from kernel_cases import DEVICE, TOLERANCE  # noqa: E402


@pytest.mark.parametrize("num_layers,positions,channels,static", [(5, 11, 70, True), (3, 9, 130, False),
                                                                 (2, depth_softmax_triton.BLOCK_P, 8, True)])
def test_the_depth_softmax_kernels_compute_the_references_aggregate_and_gradients(num_layers, positions, channels,
                                                                                  static):
    generator = torch.Generator().manual_seed(num_layers + positions)
    layers = (2 * torch.randn(num_layers, positions, channels, generator=generator)).to(DEVICE).requires_grad_()
    query = torch.randn(*(() if static else (positions,)), channels, generator=generator).to(DEVICE).requires_grad_()
    gate = torch.tensor(0.6).to(DEVICE).requires_grad_()
    grad = torch.randn(positions, channels, generator=generator).to(DEVICE)
    expected = depth_aggregate_reference(layers, query, gate)
    expected_grads = torch.autograd.grad(expected, (layers, query, gate), grad)
    inputs = [t.detach() for t in (layers, query, gate)]
    # the forward's online softmax over depth sums in another order than the reference's weights-then-sum
    torch.testing.assert_close(depth_softmax_triton.forward(*inputs, RMS_EPS), expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(depth_softmax_triton.backward(grad, *inputs, RMS_EPS), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("accumulate", [False, True])
def test_the_depth_softmax_and_mudd_backwards_write_or_add_the_layers_gradient_where_told(accumulate):
    """Into a dense connections' gradient buffer (aggregators/layer_history.py): written over what it held, or
    added to it; the other gradients as without it."""
    generator = torch.Generator().manual_seed(3)
    cases = {depth_softmax_triton: [(5, 11, 70), (70,), ()], mudd_aggregate_triton: [(3, 9, 40), (6, 40), (6, 6),
                                                                                     (2, 3)]}
    grads = {depth_softmax_triton: (11, 70), mudd_aggregate_triton: (2, 9, 40)}
    for kernels, shapes in cases.items():
        inputs = [torch.randn(shape, generator=generator).to(DEVICE) for shape in shapes]
        grad = torch.randn(grads[kernels], generator=generator).to(DEVICE)
        # MUDD's backward reads what its forward saved; attention over depth's recomputes it
        after = kernels.forward(*inputs, RMS_EPS)[1:] if kernels is mudd_aggregate_triton else (RMS_EPS,)
        expected = kernels.backward(grad, *inputs, *after)
        held = torch.randn(inputs[0].shape, generator=generator).to(DEVICE)
        target = held.clone()
        got = kernels.backward(grad, *inputs, *after, target, accumulate)
        assert got[0] is target
        torch.testing.assert_close(target, held + expected[0] if accumulate else expected[0], **TOLERANCE)
        for g, e in zip(got[1:], expected[1:]):
            assert torch.equal(g, e)


def test_the_depth_softmax_kernel_keeps_the_identity_start_exact():
    """g = 0: H~ is exactly H^L, whatever the attention."""
    layers = torch.randn(4, 6, 16).to(DEVICE)
    got = depth_softmax_triton.forward(layers, torch.randn(16).to(DEVICE), torch.tensor(0.0).to(DEVICE), RMS_EPS)
    assert torch.equal(got, layers[-1])
