"""The fused write-then-read of hyper-connections and mHC (``aggregators/ops/write_read.py``, launching the read kernels'
``forward_after_write``) against the write then the read."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import hyper_read as hyper_read_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import mhc_read as mhc_read_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import stream_write as stream_write_triton  # noqa: E402
from fairseq_capsagg.aggregators.numerics import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.ops.write_read import hyper_reference, mhc_reference  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


#: Per family with a fused write and read: its read's kernels, the reference of the write then the read, the read's
#: weights' shapes for n streams of C channels, and which of them the backward reads.
WRITE_READ = {
    "hc": (hyper_read_triton, hyper_reference, lambda n, c: [(n + 2, c), (n,), (n, n), (n,), (), ()], (0, 1, 4, 5)),
    "mhc": (mhc_read_triton, mhc_reference, lambda n, c: [(2 * n + n * n, n * c), (n,), (n,), (n, n), (3,), ()],
            (0, 1, 2, 4, 5)),
}


def _write_read_case(family: str, positions: int, n: int, channels: int, seed: int):
    """H, r, b, h, y, o, then the next connection's read weights, random leaves (mHC's gate 0.6, inside its clamp),
    and the arguments after them (mHC's home stream, and its gate shared by H_post where n is even)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(positions, n, channels), (positions, n, n), (positions, n), (positions, channels),
              (positions, channels), (n,), *WRITE_READ[family][2](n, channels)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    if family == "mhc":
        leaves[-1] = torch.tensor(0.6, device=DEVICE, requires_grad=True)
    return leaves, ((n - 1, n % 2 == 0) if family == "mhc" else ())


def _read_by_backward(family: str, inputs):
    """What the write-read backward reads of its inputs: the write's six and the read weights its backward reads."""
    return [*inputs[:6], *(inputs[6 + k] for k in WRITE_READ[family][3])]


#: Outputs of the forward that are the operator's (H', the state, h' and the read's two weights); the forward also
#: returns what its backward reads (D and 1/RMS).
OUTPUTS = 5


def _backward_after_write(family: str, above, grads, inputs, after, outputs):
    """The family's write-read backward, which also reads H' as stored and the forward's D and 1/RMS."""
    read_by = _read_by_backward(family, inputs)
    return WRITE_READ[family][0].backward_after_write(*above, *grads[2:OUTPUTS], read_by[0], outputs[0], *read_by[1:],
                                                      *outputs[OUTPUTS:], *after)


def _read_backward(family: str, grads, streams, weights, after, outputs):
    """The family's read backward alone on ``streams``, with the read's ``outputs`` (D and 1/RMS among them)."""
    return WRITE_READ[family][0].backward(*grads, streams, *weights, *outputs[3:], *after)


@pytest.mark.parametrize("family", sorted(WRITE_READ))
@pytest.mark.parametrize("positions,n,channels", [(9, 4, 70), (hyper_read_triton.BLOCK_P, 3, 130), (3, 1, 8)])
def test_the_write_read_kernels_compute_the_references_streams_next_input_and_gradients(family, positions, n,
                                                                                        channels):
    kernels, reference = WRITE_READ[family][:2]
    leaves, after = _write_read_case(family, positions, n, channels, positions + n)
    outputs = reference(*leaves, *after)
    generator = torch.Generator().manual_seed(channels)
    grads = [torch.randn(out.shape, generator=generator).to(DEVICE) for out in outputs]
    inputs = [leaf.detach().contiguous() for leaf in leaves]
    fused = kernels.forward_after_write(*inputs, *after, RMS_EPS)
    for got, want in zip(fused, outputs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # H' read above and the state read (the model passes None for an output nothing reads), or either absent
    for unused in (None, 0, 1):
        used = [torch.zeros_like(grad) if k == unused else grad for k, grad in enumerate(grads)]
        expected = torch.autograd.grad(outputs, leaves, used, retain_graph=True)
        above = [None if k == unused else grad for k, grad in enumerate(grads[:2])]
        got = _backward_after_write(family, above, grads, inputs, after, fused)
        assert len(got) == len(leaves)
        for got_grad, want in zip(got, expected):
            torch.testing.assert_close(got_grad, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", sorted(WRITE_READ))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_write_read_kernel_computes_what_the_write_then_the_read_kernels_store(family, dtype):
    """Bit for bit forward (the same sums in the same order, H' read as stored); backward the write's backward on the
    read's gradient of H' plus the one from above, against the two kernels on the same values in fp32 (in bf16 those
    round the read's gradient and the sum once more, the fused kernel rounds each gradient once)."""
    kernels = WRITE_READ[family][0]
    leaves, after = _write_read_case(family, 6, 4, 70, 5)
    inputs = [x.detach().to(dtype) if k in (0, 3, 4) else x.detach() for k, x in enumerate(leaves)]
    outputs = kernels.forward_after_write(*inputs, *after, RMS_EPS)
    written = stream_write_triton.forward(*inputs[:6])
    read = kernels.forward(written[0], *inputs[6:], *after, RMS_EPS)
    for got, want in zip(outputs, (*written, *read)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    generator = torch.Generator().manual_seed(2)
    grads = [torch.randn(out.shape, generator=generator).to(DEVICE).to(out.dtype) for out in outputs[:OUTPUTS]]
    got = _backward_after_write(family, grads[:2], grads, inputs, after, outputs)
    exact = [x.float() for x in inputs]
    read_grads = _read_backward(family, [g.float() for g in grads[2:]], written[0].float(),
                                _read_by_backward(family, exact)[6:], after, read)
    write_grads = stream_write_triton.backward(grads[0].float() + read_grads[0], grads[1].float(), *exact[:6])
    assert len(got) == len(inputs)
    for got_grad, want, leaf in zip(got, (*write_grads, *read_grads[1:]), inputs):
        assert got_grad.dtype == leaf.dtype
        scale = dict(atol=1e-2 * want.abs().max().item()) if dtype == torch.bfloat16 else {}
        torch.testing.assert_close(got_grad.float(), want, **{"rtol": 1.6e-2 if dtype == torch.bfloat16 else 1e-5,
                                                              "atol": 1e-5, **scale})


def test_the_write_read_kernel_keeps_the_identity_start_exact():
    """r = I, b = 1, streams that are copies of h, the next connection at its start (W = 0, a one-hot, A_r = I,
    B = 1): every stream, the state and the next block's input are y exactly, its weights the identity's."""
    h, y = torch.randn(6, 16).to(DEVICE), torch.randn(6, 16).to(DEVICE)
    streams = h.unsqueeze(1).expand(6, 4, 16).contiguous()
    mix, write = torch.eye(4).expand(6, 4, 4).contiguous().to(DEVICE), torch.ones(6, 4).to(DEVICE)
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0], device=DEVICE)
    out, state, next_input, next_mix, next_write, _, _ = hyper_read_triton.forward_after_write(
        streams, mix, write, h, y, one_hot, torch.zeros(6, 16, device=DEVICE), one_hot, torch.eye(4, device=DEVICE),
        torch.ones(4, device=DEVICE), torch.tensor(0.01, device=DEVICE), torch.tensor(0.01, device=DEVICE), RMS_EPS)
    assert torch.equal(out, y.unsqueeze(1).expand(6, 4, 16)) and torch.equal(state, y) and torch.equal(next_input, y)
    assert torch.equal(next_mix, mix) and torch.equal(next_write, write)
