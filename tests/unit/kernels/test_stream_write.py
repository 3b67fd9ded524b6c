"""The residual streams' write kernels (``aggregators/kernels/stream_write.py``) against the reference write (``aggregators/ops/stream_write.py``): streams, state and gradients."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import stream_write as stream_write_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops.stream_write import readout_reference, write_reference  # noqa: E402
from kernel_cases import DEVICE, TOLERANCE  # noqa: E402


@pytest.mark.parametrize("positions,n,channels", [(13, 4, 70), (5, 3, stream_write_triton.BLOCK_C),
                                                  (stream_write_triton.BLOCK_P, 1, 9)])
def test_the_write_kernels_compute_the_references_streams_state_and_gradients(positions, n, channels):
    generator = torch.Generator().manual_seed(positions + n)
    shapes = [(positions, n, channels), (positions, n, n), (positions, n), (positions, channels), (positions, channels),
              (n,)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    grads = [torch.randn(positions, n, channels, generator=generator).to(DEVICE),
             torch.randn(positions, channels, generator=generator).to(DEVICE)]
    written = write_reference(*leaves[:5])
    expected = (written, readout_reference(written, leaves[5]))
    expected_grads = torch.autograd.grad(expected, leaves, grads, retain_graph=True)
    inputs = [leaf.detach() for leaf in leaves]
    for got, want in zip(stream_write_triton.forward(*inputs), expected):
        torch.testing.assert_close(got, want, **TOLERANCE)
    for got, want in zip(stream_write_triton.backward(*grads, *inputs), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # an unused output (the state below the top block, the streams after it) brings no gradient
    for unused in range(2):
        used = [(grad if k != unused else torch.zeros_like(grad)) for k, grad in enumerate(grads)]
        got = stream_write_triton.backward(*[None if k == unused else g for k, g in enumerate(grads)], *inputs)
        for got_grad, want in zip(got, torch.autograd.grad(expected, leaves, used, retain_graph=True)):
            torch.testing.assert_close(got_grad, want, rtol=1e-5, atol=1e-5)


def test_the_write_kernel_keeps_the_identity_start_exact():
    """r = I, b = 1, streams that are copies of h and a one-hot readout: every stream and the state are y exactly."""
    h, y = torch.randn(6, 16).to(DEVICE), torch.randn(6, 16).to(DEVICE)
    streams = h.unsqueeze(1).expand(6, 4, 16).contiguous()
    mix, write = torch.eye(4).expand(6, 4, 4).contiguous().to(DEVICE), torch.ones(6, 4).to(DEVICE)
    readout = torch.tensor([1.0, 0.0, 0.0, 0.0], device=DEVICE)
    out, state = stream_write_triton.forward(streams, mix, write, h, y, readout)
    assert torch.equal(out, y.unsqueeze(1).expand(6, 4, 16)) and torch.equal(state, y)
