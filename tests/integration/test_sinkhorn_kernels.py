"""--sinkhorn-kernel: mHC's Sinkhorn-Knopp as one fused operator and through torch.compile gives the eager
loop's values and gradients, alone and in a model (torch.compile builds its kernels with a C++ compiler; the
fused operator's Triton kernels are checked against the loop in tests/unit/test_sinkhorn_triton.py)."""

import pytest
import torch

from fairseq_capsagg.aggregators import ManifoldHyperConnections, sinkhorn
from helpers import build_tiny_model, random_tokens

# inductor's fused kernels sum in another order than eager ATen's (and differently by CPU); a wrong
# compiled loop (an iteration lost, rows for columns) differs by far more
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", ["compiled", "fused"])
def test_every_sinkhorn_kernel_equals_the_eager_loop_with_its_gradient(kernel):
    for shape in [(3, 2, 4, 4), (7, 5, 4, 4)]:  # another shape needs no other compile to be right
        logits = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))).requires_grad_()
        weights = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        expected = sinkhorn(logits, kernel="eager")
        (grad,) = torch.autograd.grad((expected * weights).sum(), logits)
        got = sinkhorn(logits, kernel=kernel)
        (kernel_grad,) = torch.autograd.grad((got * weights).sum(), logits)
        assert got.is_contiguous() and got.dtype == torch.float32 and got.shape == shape
        torch.testing.assert_close(got, expected, **TOLERANCE)
        torch.testing.assert_close(kernel_grad, grad, **TOLERANCE)


@pytest.mark.parametrize("kernel", ["compiled", "fused"])
def test_an_mhc_model_computes_what_the_eager_one_does_with_every_kernel(kernel):
    eager, dictionary = build_tiny_model("transformer_mhc_base", ["--sinkhorn-kernel", "eager"])
    other, _ = build_tiny_model("transformer_mhc_base", ["--sinkhorn-kernel", kernel])
    connections = [m for m in other.modules() if isinstance(m, ManifoldHyperConnections)]
    assert connections and all(c.sinkhorn_kernel == kernel for c in connections)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the start, where every H_res is the identity whatever Sinkhorn does
        for name, p in eager.named_parameters():
            if ".dense_connections." in name:
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
    other.load_state_dict(eager.state_dict())
    src, prev = random_tokens(dictionary, [6, 3], seed=5), random_tokens(dictionary, [5, 5], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    # with autograd on, as in training: the graph compiled for the test above serves (a no-grad one is another compile)
    expected, got = eager(src, lengths, prev)[0], other(src, lengths, prev)[0]
    torch.testing.assert_close(got, expected, **TOLERANCE)
    expected.sum().backward()
    got.sum().backward()
    for (name, p), q in zip(eager.named_parameters(), other.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOLERANCE, msg=name)
