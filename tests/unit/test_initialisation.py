"""Initialisation of the routing aggregators: per-matrix statistics, the identity start, the ramp."""

import math

import pytest
import torch
from torch import nn

from fairseq_capsagg.aggregators import (AggregationRamp, DynamicRouting, EMRouting, build_aggregator,
                                         xavier_uniform_per_matrix_)
from fairseq_capsagg.aggregators.methods.capsules import IDENTITY_LAYER_SHARE
from fairseq_capsagg.aggregators.numerics import VARIANCE_FLOOR
from helpers import build_tiny_model, random_tokens

L = 6


def assert_glorot(matrix: torch.Tensor, gain: float = 1.0) -> None:
    """One (out, in) matrix drawn from U(-a, a), a = gain * sqrt(6 / (in + out))."""
    fan_out, fan_in = matrix.shape
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    assert matrix.abs().max() <= bound * (1 + 1e-6)
    std = matrix.float().std().item()
    # the sample std of n uniforms is within 4 standard errors of a / sqrt(3)
    tolerance = 4 * bound / math.sqrt(3) / math.sqrt(2 * matrix.numel()) + 1e-9
    assert abs(std - bound / math.sqrt(3)) < tolerance, (matrix.shape, std, bound / math.sqrt(3))


def test_per_matrix_init_matches_a_single_linear_layer():
    stacked = torch.empty(3, 40, 24)
    xavier_uniform_per_matrix_(stacked)
    for matrix in stacked:
        assert_glorot(matrix)
    assert_glorot(nn.init.xavier_uniform_(torch.empty(40, 24)))


@pytest.mark.parametrize("d", [128, 512])
@pytest.mark.parametrize("routing", [DynamicRouting, EMRouting])
@pytest.mark.parametrize("capsule_input,rank", [("all", 0), ("layer", 0), ("all", 64)])
def test_every_stacked_matrix_has_its_own_fan_in_and_fan_out(d, routing, capsule_input, rank):
    torch.manual_seed(0)
    n = d  # the paper's scalar capsules: each W_{l->n} is 1 x d
    agg = routing(d, L, n, 3, capsule_input, rank)
    votes = agg.vote_weight.detach().view(L, n, 1, d)
    gain = agg.vote_gain()
    for layer in range(L):
        # every W_{l->n} is a 1 x d matrix: check each layer's N of them together, and a few alone
        assert_glorot(votes[layer].reshape(n, d), gain * math.sqrt((d + n) / (d + 1)))
        assert votes[layer, 0].abs().max() <= gain * math.sqrt(6.0 / (d + 1)) * (1 + 1e-6)
    if capsule_input == "all" and rank == 0:
        for f_l in agg.input_capsules.weight.detach().view(L, d, L * d):
            assert_glorot(f_l)  # F_l: L*d -> d
    else:
        for f_l in agg.input_capsule_weight.detach():
            assert_glorot(f_l)  # F_l(H^l): d -> d, or the rank factor U_l: r -> d
    # the old whole-tensor Glorot bound at d = 128 would have been ~8x smaller than each matrix's
    assert agg.vote_weight.detach().std() > 0.5 / math.sqrt(d)


def test_dynamic_routing_vote_gain_lifts_scalar_capsules_only():
    assert DynamicRouting(128, 6, 128, 3).vote_gain() == pytest.approx((128 / 6) ** 0.4)
    assert DynamicRouting(128, 6, 4, 3).vote_gain() == 1.0
    assert EMRouting(128, 6, 128, 3).vote_gain() == 1.0
    # with the softmax over input capsules C starts at 1/L, not 1/N: no gain at any N
    assert DynamicRouting(128, 6, 128, 3, routing_softmax="input").vote_gain() == 1.0


def identity_routing(name: str, d: int = 32, n: int = 32):
    torch.manual_seed(0)
    cfg = {"output_capsules": n, "routing_init": "identity"}
    return build_aggregator(name, d, L, cfg)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.layer_norm(x, x.shape[-1:])


def test_identity_em_routing_returns_the_top_layer_when_layers_agree():
    agg = identity_routing("em-routing")
    top = torch.randn(5, 2, 32)
    out = agg([top.clone() for _ in range(L)])
    torch.testing.assert_close(layer_norm(out), layer_norm(top), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["em-routing", "dynamic-routing"])
def test_identity_routing_follows_the_top_layer(name):
    agg = identity_routing(name)
    g = torch.Generator().manual_seed(1)
    shared = torch.randn(7, 3, 32, generator=g)
    layers = [shared + 0.5 * torch.randn(7, 3, 32, generator=g) for _ in range(L)]
    out = layer_norm(agg(layers)).flatten()
    top = layer_norm(layers[-1]).flatten()
    other = layer_norm(layers[0]).flatten()
    corr = torch.corrcoef(torch.stack([out, top, other]))
    # EM routing: the mean of the votes is H^L up to the delta share of the other layers. Dynamic
    # routing with scalar capsules squashes each coordinate on its own (Omega ~ S|S| for small S) and
    # its agreement favours the largest coordinates, so it only leans towards H^L (see docs/design.md)
    assert corr[0, 1] > (0.99 if name == "em-routing" else 0.6)
    assert corr[0, 1] > corr[0, 2] + 0.1


def test_identity_em_votes_stay_off_the_variance_floor():
    agg = identity_routing("em-routing")
    g = torch.Generator().manual_seed(2)
    layers = torch.stack([torch.randn(4, 2, 32, generator=g) for _ in range(L)], dim=2)
    votes = agg.build_votes(agg.build_input_capsules(layers)).float()
    variance = votes.var(dim=2, unbiased=False)  # over the L votes, with the first M-step's equal shares
    expected = IDENTITY_LAYER_SHARE ** 2 * layers.var(dim=2, unbiased=False)
    torch.testing.assert_close(variance.flatten(-2), expected, rtol=1e-3, atol=1e-6)
    assert variance.median() > 10 * VARIANCE_FLOOR


def test_identity_init_starts_every_input_capsule_equally_active():
    agg = identity_routing("em-routing")
    assert agg.activation_weight.abs().max() == 0


def test_ramp_is_the_top_layer_at_zero_and_the_aggregate_after_k_updates():
    ramp = AggregationRamp(4)
    top, aggregate = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    assert torch.equal(ramp(top, aggregate), top)
    ramp.set_num_updates(1)
    torch.testing.assert_close(ramp(top, aggregate), 0.75 * top + 0.25 * aggregate)
    for t in (4, 5, 1000):
        ramp.set_num_updates(t)
        assert torch.equal(ramp(top, aggregate), aggregate)
    restored = AggregationRamp(4)
    ramp.set_num_updates(2)
    restored.load_state_dict(ramp.state_dict())
    torch.testing.assert_close(restored(top, aggregate), ramp(top, aggregate), rtol=0, atol=0)


@pytest.mark.parametrize("family", ["dynrouting", "emrouting", "linagg"])
def test_ramped_model_is_vanilla_at_step_zero_and_eq5_after_the_ramp(family):
    flags = ["--encoder-normalize-before", "--decoder-normalize-before"]
    vanilla, dictionary = build_tiny_model(f"transformer_{family}_base", [
        *flags, "--encoder-aggregation", "none", "--decoder-aggregation", "none"])
    ramped, _ = build_tiny_model(f"transformer_{family}_base", [*flags, "--aggregation-ramp-updates", "3"])
    plain, _ = build_tiny_model(f"transformer_{family}_base", flags)
    ramped.load_state_dict(vanilla.state_dict())  # Transformer from the vanilla model, aggregators fresh
    plain.load_state_dict({k: v for k, v in ramped.state_dict().items() if "aggregation_ramp" not in k})
    src = random_tokens(dictionary, [6, 4], seed=1)
    prev = random_tokens(dictionary, [5, 3], seed=2, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    with torch.no_grad():
        ramped.set_num_updates(0)
        torch.testing.assert_close(ramped(src, lengths, prev)[0], vanilla(src, lengths, prev)[0], rtol=0, atol=0)
        ramped.set_num_updates(3)
        torch.testing.assert_close(ramped(src, lengths, prev)[0], plain(src, lengths, prev)[0], rtol=0, atol=0)


@pytest.mark.parametrize("extra,pattern", [
    (["--aggregation-ramp-updates", "-5"], r"--aggregation-ramp-updates: got -5; it must be an integer >= 0"),
    (["--aggregation-ramp-updates", "10", "--encoder-aggregation", "none", "--decoder-aggregation", "none"],
     r"--aggregation-ramp-updates 10: neither side aggregates; set --encoder-aggregation or "
     r"--decoder-aggregation to one of linear, dynamic, dynamic-routing, em-routing"),
    (["--routing-init", "identity", "--capsule-input", "layer"], r"--routing-init identity needs the full"),
    (["--routing-init", "identity", "--capsule-rank", "8"], r"--routing-init identity needs the full"),
])
def test_bad_ramp_and_init_settings_are_refused_before_building(extra, pattern):
    from fairseq_capsagg.aggregators import AggregationConfigError

    with pytest.raises(AggregationConfigError, match=pattern):
        build_tiny_model("transformer_emrouting_small", extra)


@pytest.mark.parametrize("family", ["emrouting", "linagg"])
def test_checkpoint_trained_without_layer_norms_loads_without_them(family):
    """An aggregator saved before --aggregation-layer-norm existed computes what it was trained to."""
    old, dictionary = build_tiny_model(f"transformer_{family}_small", ["--aggregation-layer-norm", "off"])
    with torch.no_grad():
        for p in old.parameters():
            p.add_(0.05 * torch.randn_like(p))
    new, _ = build_tiny_model(f"transformer_{family}_small")  # default: on
    assert new.encoder.layer_norms is not None
    new.load_state_dict(old.state_dict(), strict=True)
    assert new.encoder.layer_norms is None and new.decoder.layer_norms is None
    src = random_tokens(dictionary, [6, 4], seed=1)
    prev = random_tokens(dictionary, [5, 3], seed=2, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    with torch.no_grad():
        torch.testing.assert_close(new(src, lengths, prev)[0], old(src, lengths, prev)[0], rtol=0, atol=0)


def test_layer_norms_where_the_side_aggregates():
    pre, _ = build_tiny_model("transformer_emrouting_small", ["--decoder-aggregation", "none"])
    assert len(pre.encoder.layer_norms) == 3 and pre.decoder.layer_norms is None
    post, _ = build_tiny_model("transformer_emrouting_base")
    assert post.encoder.layer_norms is None and post.decoder.layer_norms is None
    # post-norm: one LayerNorm on the routed aggregate instead; none after linear combination
    assert post.encoder.aggregate_norm is not None and post.decoder.aggregate_norm is not None
    linear, _ = build_tiny_model("transformer_linagg_base")
    assert linear.encoder.aggregate_norm is None and linear.encoder.layer_norms is None
    off, _ = build_tiny_model("transformer_emrouting_base", ["--aggregation-layer-norm", "off"])
    assert off.encoder.aggregate_norm is None
