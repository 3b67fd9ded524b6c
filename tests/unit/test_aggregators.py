"""Shape, masking, gradient and configuration tests of every aggregator."""

import pytest
import torch

from fairseq_capsagg.aggregators import AggregationConfigError, aggregation_choices, build_aggregator

T, B, D, L = 5, 3, 16, 4


def random_layers(t=T, b=B, d=D, num_layers=L, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(t, b, d, generator=g) for _ in range(num_layers)]


def padding_mask(lengths, t=T):
    return torch.arange(t).unsqueeze(0) >= torch.tensor(lengths).unsqueeze(1)


def build(name, **overrides):
    torch.manual_seed(0)
    settings = {"output_capsules": overrides.pop("output_capsules", 4), **overrides}
    return build_aggregator(name, D, L, settings)


@pytest.mark.parametrize("name", aggregation_choices())
def test_output_shape_and_zero_padding(name):
    agg = build(name)
    mask = padding_mask([5, 3, 1])
    out = agg(random_layers(), mask)
    assert out.shape == (T, B, D)
    assert torch.isfinite(out).all()
    if name != "none":
        assert out.transpose(0, 1)[mask].abs().max() == 0


@pytest.mark.parametrize("name", aggregation_choices())
def test_padded_positions_never_change_real_positions(name):
    agg = build(name)
    mask = padding_mask([5, 3, 2])
    layers = random_layers()
    noisy = [x.clone() for x in layers]
    for x in noisy:
        x.transpose(0, 1)[mask] = 1e3 * torch.randn(int(mask.sum()), D)
    real = ~mask.transpose(0, 1)
    torch.testing.assert_close(agg(layers, mask)[real], agg(noisy, mask)[real])


@pytest.mark.parametrize("name", [n for n in aggregation_choices() if n != "none"])
def test_gradients_reach_every_parameter(name):
    agg = build(name)
    # linear/dynamic start by selecting the top layer; perturb so every path carries gradient
    with torch.no_grad():
        for p in agg.parameters():
            p.add_(0.1 * torch.randn_like(p))
    layers = [x.requires_grad_() for x in random_layers()]
    agg(layers, padding_mask([5, 4, 2])).pow(2).sum().backward()
    for pname, p in agg.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname
    for x in layers:
        assert x.grad.abs().sum() > 0


@pytest.mark.parametrize("name", ["linear", "dynamic"])
@pytest.mark.parametrize("weights", ["vector", "matrix"])
def test_fresh_combination_selects_top_layer(name, weights):
    agg = build(name, linear_combination_weights=weights)
    layers = random_layers()
    torch.testing.assert_close(agg(layers, None), layers[-1])


def test_linear_combination_is_eq3():
    agg = build("linear")
    with torch.no_grad():
        agg.weight.copy_(torch.randn(L, D))
    layers = random_layers()
    expected = sum(agg.weight[l] * layers[l] for l in range(L))
    torch.testing.assert_close(agg(layers, None), expected)


def test_linear_matrix_combination_is_eq3():
    agg = build("linear", linear_combination_weights="matrix")
    with torch.no_grad():
        agg.weight.copy_(torch.randn(L, D, D))
    layers = random_layers()
    expected = sum(layers[l] @ agg.weight[l].t() for l in range(L))
    torch.testing.assert_close(agg(layers, None), expected, rtol=1e-4, atol=1e-4)


def test_dynamic_combination_is_eq4():
    """W_l = FFN_l([H^1..H^L]) per position, combined element-wise (slow loop reference)."""
    agg = build("dynamic", aggregation_ffn_dim=8)
    with torch.no_grad():
        agg.fc2_weight.normal_()
    layers = random_layers()
    concat = torch.cat(layers, dim=-1)
    expected = torch.zeros(T, B, D)
    w1 = agg.fc1.weight.view(L, 8, L * D)
    b1 = agg.fc1.bias.view(L, 8)
    for l in range(L):
        hidden = torch.relu(concat @ w1[l].t() + b1[l])
        weight_l = hidden @ agg.fc2_weight[l] + agg.fc2_bias[l]
        expected += weight_l * layers[l]
    torch.testing.assert_close(agg(layers, None), expected, rtol=1e-4, atol=1e-4)


def test_wrong_number_of_layers_is_explained():
    agg = build("linear")
    with pytest.raises(ValueError, match="layerdrop"):
        agg(random_layers(num_layers=L - 1), None)


@pytest.mark.parametrize(
    "name,cfg,pattern",
    [
        ("max-pool", {}, r"unknown aggregation 'max-pool'; choose one of none, linear"),
        ("em-routing", {"output_capsules": 5}, r"--output-capsules: got 5.*allowed: 1, 2, 4, 8, 16"),
        ("dynamic-routing", {"output_capsules": 0}, r"--output-capsules: got 0"),
        ("em-routing", {"routing_iters": 0}, r"--routing-iters: got 0; it must be an integer >= 1"),
        ("dynamic-routing", {"capsule_input": "some"}, r"--capsule-input: got 'some'; choose one of all, layer"),
        ("linear", {"linear_combination_weights": "scalar"}, r"--linear-combination-weights"),
        ("em-routing", {"em_inverse_temperature": 0.0}, r"--em-inverse-temperature"),
        ("em-routing", {"capsule_rank": -1}, r"--capsule-rank: got -1"),
        ("dynamic-routing", {"capsule_rank": 8, "capsule_input": "layer"}, r"--capsule-rank .* needs --capsule-input all"),
    ],
)
def test_bad_settings_name_the_flag(name, cfg, pattern):
    with pytest.raises(AggregationConfigError, match=pattern):
        build_aggregator(name, D, L, cfg, side="encoder")


def test_single_layer_cannot_be_aggregated():
    with pytest.raises(AggregationConfigError, match="at least 2 layer outputs"):
        build_aggregator("dynamic", D, 1, side="decoder")
