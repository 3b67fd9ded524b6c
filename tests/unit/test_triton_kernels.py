"""The fused operators' Triton kernels (one each way on CUDA) against their eager references: on a GPU, and
without one in Triton's interpreter on CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``): values and
gradients, padded sizes, partial blocks."""

import contextlib
import os

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators import (depth_softmax_triton, dynamic_route_triton, em_route_triton,  # noqa: E402
                                         hyper_read_triton, input_activation_triton, mhc_read_triton,
                                         mudd_aggregate_triton, sinkhorn_triton,
                                         stream_write_triton)
from fairseq_capsagg.aggregators.depth_softmax import aggregate_reference as depth_aggregate_reference  # noqa: E402
from fairseq_capsagg.aggregators.dynamic_route import routing_iterations  # noqa: E402
from fairseq_capsagg.aggregators.em_route import em_iterations  # noqa: E402
from fairseq_capsagg.aggregators.hyper_read import read_reference  # noqa: E402
from fairseq_capsagg.aggregators.input_activation import activation_reference  # noqa: E402
from fairseq_capsagg.aggregators.write_read import hyper_reference, mhc_reference  # noqa: E402
from fairseq_capsagg.aggregators.mhc_read import read_reference as mhc_read_reference  # noqa: E402
from fairseq_capsagg.aggregators.mudd_aggregate import aggregate_reference as mudd_aggregate_reference  # noqa: E402
from fairseq_capsagg.aggregators.fused import KernelFailed, kernels_on_cpu, triton_kernels  # noqa: E402
from fairseq_capsagg.aggregators.normalisation import RMS_EPS  # noqa: E402
from fairseq_capsagg.aggregators.sinkhorn import mix_reference, sinkhorn_reference  # noqa: E402
from fairseq_capsagg.aggregators.stream_write import readout_reference, write_reference  # noqa: E402

#: The kernels and the loop both sum in fp32, in another order.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


#: Where the kernels run: the GPU, or the interpreter's CPU tensors.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def launching():
    """Where the operators launch their kernels on ``DEVICE``'s tensors: on CUDA always, on the CPU in the
    interpreter."""
    return contextlib.nullcontext() if DEVICE == "cuda" else kernels_on_cpu()


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
    assert (triton_kernels("sinkhorn_triton", logits) is not None) == (DEVICE == "cuda")
    assert triton_kernels("stream_write_triton", logits.cpu()) is None
    with launching():
        assert triton_kernels("stream_write_triton", logits).forward.__wrapped__ is stream_write_triton.forward
    torch.testing.assert_close(torch.ops.capsagg.sinkhorn(logits, 5), sinkhorn_reference(logits, 5), **TOLERANCE)


def test_a_kernel_that_fails_names_itself_the_device_and_the_way_round(monkeypatch):
    from triton.runtime.errors import OutOfResources

    def out_of_shared_memory(*args):
        raise OutOfResources(262144, 232448, "shared memory")

    monkeypatch.setattr(sinkhorn_triton, "forward", out_of_shared_memory)
    with launching(), pytest.raises(KernelFailed) as failure:
        torch.ops.capsagg.sinkhorn(torch.randn(3, 4, 4, device=DEVICE), 5)
    message = str(failure.value)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    assert "sinkhorn_triton.forward" in message and device in message and "shared memory" in message
    assert "--connection-kernels eager" in message and isinstance(failure.value.__cause__, OutOfResources)


def test_running_out_of_memory_is_not_a_kernel_failure(monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(sinkhorn_triton, "forward", out_of_memory)
    with launching(), pytest.raises(torch.OutOfMemoryError):
        torch.ops.capsagg.sinkhorn(torch.randn(3, 4, 4, device=DEVICE), 5)


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
    for got, want in zip(hyper_read_triton.forward(*inputs, RMS_EPS), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = hyper_read_triton.backward(*grads, inputs[0], inputs[1], inputs[2], inputs[5], inputs[6], RMS_EPS)
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
    for got, want in zip(hyper_read_triton.forward(streams, *weights, RMS_EPS),
                         hyper_read_triton.forward(streams, *exact, RMS_EPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    read_by_backward = (0, 1, 4, 5)  # W, A_m, s_a, s_b
    got = hyper_read_triton.backward(*grads, streams, *(weights[i] for i in read_by_backward), RMS_EPS)
    want = hyper_read_triton.backward(*grads, streams, *(exact[i] for i in read_by_backward), RMS_EPS)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for got_grad, want_grad in zip(got[1:], want[1:]):
        assert got_grad.dtype == torch.bfloat16
        torch.testing.assert_close(got_grad, want_grad.to(torch.bfloat16), rtol=0, atol=0)


def test_the_hyper_read_kernel_keeps_the_identity_start_exact():
    """W = 0: a is one-hot, so h is exactly the home stream, r = A_r and b = B."""
    streams = torch.randn(5, 4, 16).to(DEVICE)
    read = torch.zeros(4, device=DEVICE)
    read[2] = 1.0
    h, mix, write = hyper_read_triton.forward(streams, torch.zeros(6, 16, device=DEVICE), read,
                                              torch.eye(4, device=DEVICE), torch.ones(4, device=DEVICE),
                                              torch.tensor(0.01, device=DEVICE), torch.tensor(0.01, device=DEVICE),
                                              RMS_EPS)
    assert torch.equal(h, streams[:, 2]) and torch.equal(mix, torch.eye(4, device=DEVICE).expand(5, 4, 4))
    assert torch.equal(write, torch.ones(5, 4, device=DEVICE))


#: Per family with a fused write and read: its read's kernels, the reference of the write then the read, the read's
#: weights' shapes for n streams of C channels, and which of them the backward reads.
WRITE_READ = {
    "hc": (hyper_read_triton, hyper_reference, lambda n, c: [(n + 2, c), (n,), (n, n), (n,), (), ()], (0, 1, 4, 5)),
    "mhc": (mhc_read_triton, mhc_reference, lambda n, c: [(2 * n + n * n, n * c), (n,), (n,), (n, n), (3,), ()],
            (0, 1, 2, 4, 5)),
}


def _write_read_case(family: str, positions: int, n: int, channels: int, seed: int):
    """H, r, b, h, y, o, then the next connection's read weights, random leaves (mHC's gate 0.6, inside its clamp),
    and the arguments after them (mHC's home stream)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(positions, n, channels), (positions, n, n), (positions, n), (positions, channels),
              (positions, channels), (n,), *WRITE_READ[family][2](n, channels)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    if family == "mhc":
        leaves[-1] = torch.tensor(0.6, device=DEVICE, requires_grad=True)
    return leaves, ((n - 1,) if family == "mhc" else ())


def _read_by_backward(family: str, inputs):
    """What the write-read backward reads of its inputs: the write's six and the read weights its backward reads."""
    return [*inputs[:6], *(inputs[6 + k] for k in WRITE_READ[family][3])]


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
    for got, want in zip(kernels.forward_after_write(*inputs, *after, RMS_EPS), outputs):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # H' read above and the state read (the model passes None for an output nothing reads), or either absent
    for unused in (None, 0, 1):
        used = [torch.zeros_like(grad) if k == unused else grad for k, grad in enumerate(grads)]
        expected = torch.autograd.grad(outputs, leaves, used, retain_graph=True)
        above = [None if k == unused else grad for k, grad in enumerate(grads[:2])]
        got = kernels.backward_after_write(*above, *grads[2:], *_read_by_backward(family, inputs), *after, RMS_EPS)
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
    grads = [torch.randn(out.shape, generator=generator).to(DEVICE).to(out.dtype) for out in outputs]
    got = kernels.backward_after_write(*grads, *_read_by_backward(family, inputs), *after, RMS_EPS)
    exact = [x.float() for x in inputs]
    read_grads = kernels.backward(*[g.float() for g in grads[2:]], written[0].float(),
                                  *_read_by_backward(family, exact)[6:], *after, RMS_EPS)
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
    out, state, next_input, next_mix, next_write = hyper_read_triton.forward_after_write(
        streams, mix, write, h, y, one_hot, torch.zeros(6, 16, device=DEVICE), one_hot, torch.eye(4, device=DEVICE),
        torch.ones(4, device=DEVICE), torch.tensor(0.01, device=DEVICE), torch.tensor(0.01, device=DEVICE), RMS_EPS)
    assert torch.equal(out, y.unsqueeze(1).expand(6, 4, 16)) and torch.equal(state, y) and torch.equal(next_input, y)
    assert torch.equal(next_mix, mix) and torch.equal(next_write, write)


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
    torch.testing.assert_close(depth_softmax_triton.forward(*inputs, RMS_EPS), expected, **TOLERANCE)
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
        expected = kernels.backward(grad, *inputs, RMS_EPS)
        held = torch.randn(inputs[0].shape, generator=generator).to(DEVICE)
        target = held.clone()
        got = kernels.backward(grad, *inputs, RMS_EPS, target, accumulate)
        assert got[0] is target
        torch.testing.assert_close(target, held + expected[0] if accumulate else expected[0], **TOLERANCE)
        for g, e in zip(got[1:], expected[1:]):
            assert torch.equal(g, e)


def test_the_depth_softmax_kernel_keeps_the_identity_start_exact():
    """g = 0: H~ is exactly H^L, whatever the attention."""
    layers = torch.randn(4, 6, 16).to(DEVICE)
    got = depth_softmax_triton.forward(layers, torch.randn(16).to(DEVICE), torch.tensor(0.0).to(DEVICE), RMS_EPS)
    assert torch.equal(got, layers[-1])


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
    torch.testing.assert_close(mudd_aggregate_triton.forward(*inputs, RMS_EPS), expected, rtol=1e-4, atol=1e-4)
    for got, want in zip(mudd_aggregate_triton.backward(grad, *inputs, RMS_EPS), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_mudd_kernel_keeps_the_identity_start_exact():
    """W_2 = 0 and b one-hot on H^L: every stream is exactly H^L."""
    layers = torch.randn(3, 5, 16).to(DEVICE)
    static = torch.zeros(4, 3, device=DEVICE)
    static[:, -1] = 1.0
    got = mudd_aggregate_triton.forward(layers, torch.randn(12, 16).to(DEVICE), torch.zeros(12, 12, device=DEVICE),
                                        static, RMS_EPS)
    assert torch.equal(got, layers[-1].expand(4, 5, 16))


@pytest.mark.parametrize("positions,n,channels,home", [(9, 4, 40, 2), (mhc_read_triton.BLOCK_P, 3, 20, 0),
                                                       (3, 2, 8, 1)])
@pytest.mark.parametrize("gate", [0.6, 1.3])
def test_the_mhc_read_kernels_compute_the_references_read_logits_and_gradients(positions, n, channels, home, gate):
    """Also with the gate above its clamp, where its gradient passes through as through the identity."""
    generator = torch.Generator().manual_seed(positions + n)
    shapes = [(positions, n, channels), (2 * n + n * n, n * channels), (n,), (n,), (n, n), (3,)]
    leaves = [torch.randn(shape, generator=generator).to(DEVICE).requires_grad_() for shape in shapes]
    leaves.append(torch.tensor(gate, device=DEVICE, requires_grad=True))
    grads = [torch.randn(shape, generator=generator).to(DEVICE) for shape in ((positions, channels),
                                                                             (positions, n, n), (positions, n))]
    expected = mhc_read_reference(*leaves, home)
    expected_grads = torch.autograd.grad(expected, leaves, grads)
    inputs = [leaf.detach().contiguous() for leaf in leaves]
    for got, want in zip(mhc_read_triton.forward(*inputs, home, RMS_EPS), expected):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = mhc_read_triton.backward(*grads, *inputs[:4], *inputs[5:], home, RMS_EPS)
    for got, want in zip(got_grads, expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


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
    torch.testing.assert_close(module.forward(layers, *weights, RMS_EPS), module.forward(layers, *exact, RMS_EPS),
                               rtol=0, atol=0)
    got, want = module.backward(grad, layers, *weights, RMS_EPS), module.backward(grad, layers, *exact, RMS_EPS)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    for index, (got_grad, want_grad) in enumerate(zip(got[1:], want[1:])):
        assert got_grad.dtype == torch.bfloat16
        # a query per position's gradient is rounded by the kernel as it stores it (Triton's interpreter rounds
        # towards zero, torch to nearest): one bf16 step apart at most; the others are rounded by torch, exactly
        rounded_by_kernel = index == 0 and kernels == "depth softmax, query per position"
        torch.testing.assert_close(got_grad, want_grad.to(torch.bfloat16), rtol=2 ** -7 if rounded_by_kernel else 0,
                                   atol=0)


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
    for got, want in zip(mhc_read_triton.forward(streams, *weights, home, RMS_EPS),
                         mhc_read_triton.forward(streams, *exact, home, RMS_EPS)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    read_by_backward = (0, 1, 2, 4, 5)  # phi, b_pre, b_post, alpha, the gate
    got = mhc_read_triton.backward(*grads, streams, *(weights[i] for i in read_by_backward), home, RMS_EPS)
    want = mhc_read_triton.backward(*grads, streams, *(exact[i] for i in read_by_backward), home, RMS_EPS)
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


@pytest.mark.parametrize("gate", [0.4, -0.3])
def test_the_blending_sinkhorn_kernels_compute_mhcs_mix_and_gradients(gate):
    """I + g (P^T - I) and the gradients of the logits and the gate (the identity through the clamp)."""
    generator = torch.Generator().manual_seed(5)
    logits = (3 * torch.randn(37, 4, 4, generator=generator)).to(DEVICE).requires_grad_()
    gate = torch.tensor(gate, device=DEVICE, requires_grad=True)
    grad = torch.randn(37, 4, 4, generator=generator).to(DEVICE)
    expected = mix_reference(logits, gate, 20)
    expected_grads = torch.autograd.grad(expected, (logits, gate), grad)
    torch.testing.assert_close(sinkhorn_triton.forward(logits.detach(), 20, gate.detach()), expected, **TOLERANCE)
    for got, want in zip(sinkhorn_triton.backward(logits.detach(), grad, 20, gate.detach()), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


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


@pytest.mark.parametrize("num_layers,capsules,capsule_dim,iterations", [(6, 16, 1, 3), (3, 5, 4, 2), (4, 2, 3, 1)])
def test_the_em_routing_kernels_compute_the_loops_capsules_and_gradients(num_layers, capsules, capsule_dim,
                                                                        iterations):
    generator = torch.Generator().manual_seed(num_layers + capsules)
    votes = torch.randn(5, num_layers, capsules, capsule_dim, generator=generator).to(DEVICE).requires_grad_()
    input_act = torch.rand(5, num_layers, generator=generator).to(DEVICE).requires_grad_()
    beta_a, beta_mu = (torch.randn(capsules, generator=generator).to(DEVICE).requires_grad_() for _ in range(2))
    grad = torch.randn(5, capsules, capsule_dim, generator=generator).to(DEVICE)
    leaves = (votes, input_act, beta_a, beta_mu)
    expected = em_iterations(*leaves, iterations, 1.5)
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    inputs = [leaf.detach() for leaf in leaves]
    torch.testing.assert_close(em_route_triton.forward(*inputs, iterations, 1.5), expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(em_route_triton.backward(grad, *inputs, iterations, 1.5), expected_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_the_em_routing_kernels_read_a_bf16_models_betas_as_they_are():
    """beta_A and beta_mu of a model cast to bf16: upcast as loaded (the values of their fp32 copies exactly), their
    gradients returned in bf16."""
    generator = torch.Generator().manual_seed(3)
    votes = torch.randn(5, 4, 3, 2, generator=generator).to(DEVICE)
    input_act = torch.rand(5, 4, generator=generator).to(DEVICE)
    betas = [torch.randn(3, generator=generator).to(DEVICE, torch.bfloat16) for _ in range(2)]
    grad = torch.randn(5, 3, 2, generator=generator).to(DEVICE)
    upcast = [beta.float() for beta in betas]
    assert torch.equal(em_route_triton.forward(votes, input_act, *betas, 2, 1.5),
                       em_route_triton.forward(votes, input_act, *upcast, 2, 1.5))
    got = em_route_triton.backward(grad, votes, input_act, *betas, 2, 1.5)
    want = em_route_triton.backward(grad, votes, input_act, *upcast, 2, 1.5)
    assert [g.dtype for g in got[2:]] == [torch.bfloat16, torch.bfloat16]
    for g, w in zip(got, want):
        assert torch.equal(g, w.to(g.dtype))


@pytest.mark.parametrize("num_layers,capsules,capsule_dim,iterations,over_inputs", [
    (6, 16, 1, 3, False), (3, 5, 4, 2, True), (4, 2, 3, 1, False), (5, 3, 2, 3, True)])
def test_the_dynamic_routing_kernels_compute_the_loops_capsules_and_gradient(num_layers, capsules, capsule_dim,
                                                                            iterations, over_inputs):
    generator = torch.Generator().manual_seed(num_layers + capsules)
    votes = (2 * torch.randn(5, num_layers, capsules, capsule_dim, generator=generator)).to(DEVICE).requires_grad_()
    grad = torch.randn(5, capsules, capsule_dim, generator=generator).to(DEVICE)
    expected = routing_iterations(votes, iterations, over_inputs)
    (expected_grad,) = torch.autograd.grad(expected, votes, grad)
    torch.testing.assert_close(dynamic_route_triton.forward(votes.detach(), iterations, over_inputs), expected,
                               **TOLERANCE)
    torch.testing.assert_close(dynamic_route_triton.backward(grad, votes.detach(), iterations, over_inputs),
                               expected_grad, rtol=1e-4, atol=1e-5)


def layers_first(votes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``votes`` (P, L, N, D) rounded to ``dtype`` and laid out layers first, as the votes' batched product over the
    layers leaves them."""
    return votes.to(dtype).transpose(0, 1).contiguous().transpose(0, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_routing_kernels_read_the_votes_in_their_precision_and_layout(dtype):
    """The kernels read bf16 votes and votes laid out layers first where they are, route them in fp32 as the loops
    route their fp32 copy, and write the votes' gradient in the votes' precision and layout."""
    generator = torch.Generator().manual_seed(31)
    votes = layers_first(2 * torch.randn(7, 5, 3, 2, generator=generator), dtype).to(DEVICE)
    assert not votes.is_contiguous()
    exact = votes.float().requires_grad_()
    grad = torch.randn(7, 3, 2, generator=generator).to(DEVICE)
    input_act = torch.rand(7, 5, generator=generator).to(DEVICE)
    betas = [torch.randn(3, generator=generator).to(DEVICE) for _ in range(2)]
    for name, kernel_forward, kernel_backward, loop in [
            ("dynamic", lambda v: dynamic_route_triton.forward(v, 3, True),
             lambda v: dynamic_route_triton.backward(grad, v, 3, True)[None],
             lambda v: routing_iterations(v, 3, True)),
            ("em", lambda v: em_route_triton.forward(v, input_act, *betas, 3, 1.5),
             lambda v: em_route_triton.backward(grad, v, input_act, *betas, 3, 1.5),
             lambda v: em_iterations(v, input_act, *betas, 3, 1.5))]:
        expected = loop(exact)
        (expected_grad,) = torch.autograd.grad(expected, exact, grad)
        out = kernel_forward(votes)
        assert out.dtype == torch.float32, name
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        grad_votes = kernel_backward(votes)[0]
        assert grad_votes.dtype == dtype and grad_votes.stride() == votes.stride(), name
        # rounded to bf16 by the kernel as it stores it (Triton's interpreter rounds towards zero, torch to nearest)
        # from fp32 sums in another order: one bf16 step (2^-7 relative) apart at most
        rtol = 1e-4 if dtype == torch.float32 else 2 ** -7
        torch.testing.assert_close(grad_votes, expected_grad.to(dtype), rtol=rtol, atol=1e-4)
