"""--compile-sinkhorn: mHC's Sinkhorn-Knopp through torch.compile gives the eager loop's values and
gradients, alone and in a model (torch.compile builds its kernels with a C++ compiler; mHC hands Sinkhorn
fp32 logits whatever the model's precision, as tests/unit/test_residual_streams.py checks)."""

import torch

from fairseq_capsagg.aggregators import ManifoldHyperConnections, sinkhorn
from fairseq_capsagg.aggregators.mhc import compiled_sinkhorn
from helpers import build_tiny_model, random_tokens

# inductor's fused kernels sum in another order than eager ATen's (and differently by CPU); a wrong
# compiled loop (an iteration lost, rows for columns) differs by far more
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def test_compiled_sinkhorn_equals_the_eager_loop_with_its_gradient():
    for shape in [(3, 2, 4, 4), (7, 5, 4, 4)]:  # another shape needs no other compile to be right
        logits = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))).requires_grad_()
        weights = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        expected = sinkhorn(logits)
        (grad,) = torch.autograd.grad((expected * weights).sum(), logits)
        got = compiled_sinkhorn()(logits)
        (compiled_grad,) = torch.autograd.grad((got * weights).sum(), logits)
        assert got.is_contiguous() and got.dtype == torch.float32
        torch.testing.assert_close(got, expected, **TOLERANCE)
        torch.testing.assert_close(compiled_grad, grad, **TOLERANCE)


def test_an_mhc_model_with_the_compiled_sinkhorn_computes_what_the_eager_one_does():
    eager, dictionary = build_tiny_model("transformer_mhc_base", [])
    compiled, _ = build_tiny_model("transformer_mhc_base", ["--compile-sinkhorn"])
    connections = [m for m in compiled.modules() if isinstance(m, ManifoldHyperConnections)]
    assert connections and all(c.compile_sinkhorn for c in connections)
    assert not any(m.compile_sinkhorn for m in eager.modules() if isinstance(m, ManifoldHyperConnections))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the start, where every H_res is the identity whatever Sinkhorn does
        for name, p in eager.named_parameters():
            if ".dense_connections." in name:
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
    compiled.load_state_dict(eager.state_dict())
    src, prev = random_tokens(dictionary, [6, 3], seed=5), random_tokens(dictionary, [5, 5], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    # with autograd on, as in training: the graph compiled for the test above serves (a no-grad one is another compile)
    torch.testing.assert_close(compiled(src, lengths, prev)[0], eager(src, lengths, prev)[0], **TOLERANCE)
