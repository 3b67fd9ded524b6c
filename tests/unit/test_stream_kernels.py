"""--stream-kernels: the residual streams' dynamic weights (act(RMSNorm(x) W^T)), their write and mHC's
Sinkhorn-Knopp as fused operators compute what their eager references do, values and gradients, alone and in hyper-connections and mHC models (on the CPU the fused
operators run the references inside; their Triton kernels are tests/unit/test_triton_kernels.py's)."""

import pytest
import torch

from fairseq_capsagg.aggregators import HyperConnections, ManifoldHyperConnections, sinkhorn
from fairseq_capsagg.aggregators.norm_linear import norm_linear
from fairseq_capsagg.aggregators.stream_write import stream_write
from helpers import build_tiny_model, random_tokens

# the fused backward sums its products in another order than autograd's
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def test_the_fused_sinkhorn_equals_the_eager_loop_with_its_gradient():
    for shape in [(3, 2, 4, 4), (7, 5, 3, 3)]:
        logits = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))).requires_grad_()
        weights = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        expected = sinkhorn(logits, kernel="eager")
        (grad,) = torch.autograd.grad((expected * weights).sum(), logits)
        got = sinkhorn(logits, kernel="fused")
        (fused_grad,) = torch.autograd.grad((got * weights).sum(), logits)
        assert got.is_contiguous() and got.dtype == torch.float32 and got.shape == shape
        torch.testing.assert_close(got, expected, **TOLERANCE)
        torch.testing.assert_close(fused_grad, grad, **TOLERANCE)


@pytest.mark.parametrize("per_position", [True, False], ids=["dynamic weights", "static weights"])
def test_the_fused_write_equals_the_reference_with_every_gradient(per_position):
    generator = torch.Generator().manual_seed(3)
    t, b, n, c = 5, 2, 4, 6
    weights_shape = (t, b) if per_position else ()
    inputs = [torch.randn(t, b, n, c, generator=generator), torch.randn(*weights_shape, n, n, generator=generator),
              torch.randn(*weights_shape, n, generator=generator), torch.randn(t, b, c, generator=generator),
              torch.randn(t, b, c, generator=generator)]
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = stream_write(*leaves, kernel=kernel)
        out.backward(torch.ones_like(out) + out.detach())
        results[kernel] = out.detach(), [leaf.grad for leaf in leaves]
    torch.testing.assert_close(results["fused"][0], results["eager"][0], **TOLERANCE)
    for fused, eager in zip(results["fused"][1], results["eager"][1]):
        torch.testing.assert_close(fused, eager, **TOLERANCE)


@pytest.mark.parametrize("tanh", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_dynamic_weights_equal_the_reference_with_their_gradients(tanh, dtype):
    generator = torch.Generator().manual_seed(7)
    x = (3 * torch.randn(5, 2, 4, 12, generator=generator)).to(dtype)
    weight = torch.randn(6, 12, generator=generator)
    results = {}
    for kernel in ("eager", "fused"):
        leaves = x.clone().requires_grad_(), weight.clone().requires_grad_()
        out = norm_linear(*leaves, tanh=tanh, kernel=kernel)
        out.backward(torch.cos(out.detach()))
        results[kernel] = out.detach(), [leaf.grad for leaf in leaves]
    assert results["fused"][0].dtype == torch.float32 and results["fused"][0].shape == (5, 2, 4, 6)
    torch.testing.assert_close(results["fused"][0], results["eager"][0], **TOLERANCE)
    for fused, eager in zip(results["fused"][1], results["eager"][1]):
        assert fused.dtype == eager.dtype
        torch.testing.assert_close(fused.float(), eager.float(), rtol=1e-4, atol=1e-5)


def test_the_fused_write_keeps_the_identity_start_exact():
    """r = I, b = 1 and streams that are copies of h: every stream becomes exactly y, as in the reference."""
    h, y = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    streams = h.unsqueeze(2).expand(4, 3, 2, 8).contiguous()
    out = stream_write(streams, torch.eye(2), torch.ones(2), h, y, kernel="fused")
    assert torch.equal(out, y.unsqueeze(2).expand_as(out))


@pytest.mark.parametrize("family,cls", [("hc", HyperConnections), ("mhc", ManifoldHyperConnections)])
def test_a_streams_model_computes_what_the_eager_one_does_with_the_fused_kernels(family, cls):
    eager, dictionary = build_tiny_model(f"transformer_{family}_base", ["--stream-kernels", "eager"])
    fused, _ = build_tiny_model(f"transformer_{family}_base")
    connections = [m for m in fused.modules() if isinstance(m, cls)]
    assert connections and all(c.kernels == "fused" for c in connections)  # the default
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the start, where every H_res is the identity whatever Sinkhorn does
        for name, p in eager.named_parameters():
            if ".dense_connections." in name:
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
    fused.load_state_dict(eager.state_dict())
    src, prev = random_tokens(dictionary, [6, 3], seed=5), random_tokens(dictionary, [5, 5], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    expected, got = eager(src, lengths, prev)[0], fused(src, lengths, prev)[0]
    torch.testing.assert_close(got, expected, **TOLERANCE)
    expected.pow(2).sum().backward()
    got.pow(2).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
