"""EM routing's kernels (``aggregators/kernels/em_route.py``) against the loop (``aggregators/ops/em_route.py``)."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import em_route as em_route_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops.em_route import em_iterations  # noqa: E402
from kernel_cases import DEVICE  # noqa: E402


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
