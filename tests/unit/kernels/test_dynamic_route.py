"""Dynamic routing's kernels (``aggregators/kernels/dynamic_route.py``) against the loop (``aggregators/ops/dynamic_route.py``), and both routing
kernels' reading of the votes in their precision and layout."""

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import dynamic_route as dynamic_route_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import em_route as em_route_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops.dynamic_route import routing_iterations  # noqa: E402
from fairseq_capsagg.aggregators.ops.em_route import em_iterations  # noqa: E402
from kernel_cases import DEVICE, TOLERANCE  # noqa: E402


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
