"""Dynamic and EM routing against the slow references, invariants and numerics."""

import pytest
import routing_reference as ref
import torch
from routing_cases import ROUTINGS, B, D, L, T, build, layers

from fairseq_capsagg.aggregators import squash
from fairseq_capsagg.aggregators.numerics import VARIANCE_FLOOR


def assert_position_matches(agg, out, t: int, b: int, omega, history) -> None:
    """Position (t, b) of a routing's output and of its agreement at every iteration against the reference's."""
    torch.testing.assert_close(out[t, b].double(), torch.cat(omega), rtol=1e-4, atol=1e-5)
    for it, agreement in enumerate(history):
        torch.testing.assert_close(agg.agreement[it][t, b].double(), torch.tensor(agreement, dtype=torch.double),
                                   rtol=1e-4, atol=1e-5)


#: The routing shapes both algorithms are checked at: output capsules, iterations, input capsules.
routing_shapes = pytest.mark.parametrize("n_caps,iters,capsule_input", [
    (n_caps, iters, capsule_input) for n_caps in (1, 4, D) for iters in (1, 3)
    for capsule_input in ("all", "layer", "all-rank3")])


@routing_shapes
@pytest.mark.parametrize("routing_softmax", ["output", "input"])
@torch.no_grad()
def test_dynamic_routing_matches_algorithm_1(n_caps, iters, capsule_input, routing_softmax):
    agg = build("dynamic-routing", n_caps, iters, capsule_input, routing_softmax=routing_softmax)
    agg.capture_agreement = True
    xs = layers()
    out = agg(xs, None)
    for t in range(T):
        for b in range(B):
            _, votes = ref.reference_votes(agg, [x[t, b].double() for x in xs])
            omega, history = ref.dynamic_routing(votes, iters, routing_softmax)
            assert_position_matches(agg, out, t, b, omega, history)


@routing_shapes
@torch.no_grad()
def test_em_routing_matches_algorithm_2(n_caps, iters, capsule_input):
    agg = build("em-routing", n_caps, iters, capsule_input)
    agg.capture_agreement = True
    xs = layers()
    out = agg(xs, None)
    for t in range(T):
        for b in range(B):
            capsules, votes = ref.reference_votes(agg, [x[t, b].double() for x in xs])
            input_act = [torch.sigmoid(agg.activation_weight[l].double() @ capsules[l]
                                       + agg.activation_bias[l].double()).item() for l in range(L)]
            omega, history, acts = ref.em_routing(votes, input_act, agg.beta_a, agg.beta_mu, iters,
                                                  agg.inverse_temperature, VARIANCE_FLOOR)
            assert_position_matches(agg, out, t, b, omega, history)
            torch.testing.assert_close(agg.output_activations[-1][t, b].double(),
                                       torch.tensor(acts, dtype=torch.double), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ROUTINGS)
def test_agreement_is_a_distribution_over_output_capsules(name):
    agg = build(name, n_caps=4, iters=4)
    agg.capture_agreement = True
    agg(layers(scale=3.0), None)
    assert len(agg.agreement) == 4
    for c in agg.agreement:
        assert c.shape == (T, B, L, 4)
        assert (c >= 0).all()
        torch.testing.assert_close(c.sum(-1), torch.ones(T, B, L))
    torch.testing.assert_close(agg.agreement[0], torch.full((T, B, L, 4), 0.25))


def test_softmax_over_input_capsules_is_a_distribution_over_layers():
    agg = build("dynamic-routing", n_caps=4, iters=4, routing_softmax="input")
    agg.capture_agreement = True
    agg(layers(scale=3.0), None)
    for c in agg.agreement:
        assert c.shape == (T, B, L, 4) and (c >= 0).all()
        torch.testing.assert_close(c.sum(-2), torch.ones(T, B, 4))
    torch.testing.assert_close(agg.agreement[0], torch.full((T, B, L, 4), 1 / L))


def test_nothing_is_recorded_unless_capturing():
    agg = build("em-routing")
    agg(layers(), None)
    assert agg.agreement == [] and agg.output_activations == []


def test_squash_norm_below_one_and_keeps_direction():
    s = torch.randn(100, 6, generator=torch.Generator().manual_seed(0))
    s = s * torch.logspace(-4, 4, 100).unsqueeze(1)
    out = squash(s)
    norms = out.norm(dim=-1)
    assert (norms <= 1).all()
    assert (norms[s.norm(dim=-1) < 100] < 1).all()  # beyond that fp32 rounds |S|^2/(1+|S|^2) to 1
    visible = s.norm(dim=-1) > 1e-2  # cosine_similarity's own eps swamps smaller vectors
    cos = torch.nn.functional.cosine_similarity(out[visible], s[visible], dim=-1)
    torch.testing.assert_close(cos, torch.ones_like(cos))
    s_norm = s.norm(dim=-1)
    torch.testing.assert_close(norms[visible], (s_norm ** 2 / (1 + s_norm ** 2))[visible])


def test_dynamic_routing_one_iteration_closed_form():
    """T = 1: Omega_n = squash(1/N sum_l V_{l->n})."""
    agg = build("dynamic-routing", n_caps=4, iters=1)
    xs = layers()
    votes = agg.build_votes(agg.build_input_capsules(torch.stack(xs, 2)))
    expected = squash(votes.sum(dim=2) / 4).flatten(-2)
    torch.testing.assert_close(agg(xs, None), expected)


def test_dynamic_routing_over_input_capsules_one_iteration_closed_form():
    """T = 1 with the softmax over input capsules: Omega_n = squash(mean_l V_{l->n}), for any N."""
    for n_caps in (1, 4, D):
        agg = build("dynamic-routing", n_caps=n_caps, iters=1, routing_softmax="input")
        xs = layers()
        votes = agg.build_votes(agg.build_input_capsules(torch.stack(xs, 2)))
        torch.testing.assert_close(agg(xs, None), squash(votes.mean(dim=2)).flatten(-2))


def test_em_routing_one_iteration_closed_form():
    """T = 1: mu_n = sum_l A_l V_{l->n} / sum_l A_l, Omega_n = A^Omega_n mu_n."""
    agg = build("em-routing", n_caps=4, iters=1)
    agg.capture_agreement = True
    xs = layers()
    out = agg(xs, None)
    votes = agg.build_votes(agg.build_input_capsules(torch.stack(xs, 2)))
    a = agg.input_activations.unsqueeze(-1).unsqueeze(-1)
    mu = (a * votes).sum(2) / a.sum(2)
    expected = (agg.output_activations[0].unsqueeze(-1) * mu).flatten(-2)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ROUTINGS)
def test_sentence_alone_equals_sentence_in_padded_batch(name):
    agg = build(name)
    g = torch.Generator().manual_seed(3)
    batch = [torch.randn(6, 3, D, generator=g) for _ in range(L)]
    mask = torch.tensor([[False] * 6, [False] * 4 + [True] * 2, [False] * 2 + [True] * 4])
    together = agg(batch, mask)
    for b, length in enumerate([6, 4, 2]):
        alone = agg([x[:length, b:b + 1] for x in batch], None)
        torch.testing.assert_close(together[:length, b:b + 1], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ROUTINGS)
@pytest.mark.parametrize("case", ["zeros", "huge", "tiny"])
def test_forward_and_backward_finite_at_extremes(name, case):
    agg = build(name)
    scale = {"zeros": 0.0, "huge": 1e4, "tiny": 1e-6}[case]
    if case == "zeros":
        with torch.no_grad():
            agg.input_capsules.bias.zero_()
    xs = [x.requires_grad_() for x in layers(scale=scale)]
    mask = torch.tensor([[False, False, True], [False, True, True]])
    out = agg(xs, mask)
    out.sum().backward()
    assert torch.isfinite(out).all()
    for p in list(agg.parameters()) + xs:
        assert torch.isfinite(p.grad).all()


@pytest.mark.parametrize("name", ROUTINGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_module_routes_in_fp32(name, dtype):
    agg = build(name)
    reference = agg([x for x in layers()], None)
    agg = agg.to(dtype)
    agg.capture_agreement = True
    xs = [x.to(dtype).requires_grad_() for x in layers(scale=30.0)]
    out = agg(xs, None)
    assert out.dtype == dtype
    assert agg.agreement[-1].dtype == torch.float32
    # a mean, not a sum: with each matrix at its own Glorot scale, the true gradient of the sum at
    # inputs of scale 30 exceeds fp16's range (131k in fp32), which is the loss scaler's case
    out.float().pow(2).mean().backward()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p.grad).all() for p in agg.parameters())
    out_small = agg([x.to(dtype) for x in layers()], None)
    torch.testing.assert_close(out_small.float(), reference, rtol=0.1, atol=0.05)


@pytest.mark.parametrize("name", ROUTINGS)
def test_autocast_bf16_keeps_routing_in_fp32(name):
    agg = build(name)
    agg.capture_agreement = True
    xs = [x.requires_grad_() for x in layers(scale=10.0)]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = agg(xs, None)
    assert agg.agreement[-1].dtype == torch.float32
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all()
    assert all(torch.isfinite(x.grad).all() for x in xs)


def test_non_finite_routing_names_module_and_iteration():
    from fairseq_capsagg.aggregators import NonFiniteAggregationError

    agg = build("em-routing")
    agg.side = "decoder"
    agg.train()
    with torch.no_grad():
        agg.beta_a.fill_(float("nan"))  # poisons the activations of iteration 1
    with pytest.raises(NonFiniteAggregationError,
                       match=r"decoder aggregator EMRouting: non-finite agreement C at routing iteration 2 of 3"):
        agg(layers(), None)
    agg = build("dynamic-routing")
    agg.side = "encoder"
    agg.train()
    with torch.no_grad():
        agg.vote_weight[0, 0, 0] = float("inf")
    with pytest.raises(NonFiniteAggregationError, match=r"encoder aggregator DynamicRouting: non-finite votes"):
        agg(layers(), None)


def test_non_finite_inputs_are_left_to_the_loss_scaler():
    agg = build("em-routing")
    agg.train()
    xs = layers()
    xs[0][0, 0, 0] = float("inf")  # an fp16 overflow upstream: fairseq's scaler must see it, not us
    out = agg(xs, None)
    assert not torch.isfinite(out).all()


def test_training_checks_finite_aggregates_without_waiting_on_a_gpu():
    """On the CPU every training aggregate is checked; a GPU tensor only under anomaly detection, since reading
    the check's result would make every connection wait for the GPU."""
    from fairseq_capsagg.aggregators.base import checks_finite

    assert checks_finite(torch.zeros(2))
    gpu_like = torch.zeros(2, device="meta")  # any device but the CPU's
    assert not checks_finite(gpu_like)
    with torch.autograd.set_detect_anomaly(True):
        assert checks_finite(gpu_like)
