"""The peers of routing: DenseFormer's DWA, attention over depth and MUDD connections, at the stack's
output and between blocks, against slow loops written from their papers."""

import math
from typing import List

import pytest
import torch
import torch.nn.functional as F

from fairseq_capsagg.aggregators import (AggregationConfigError, DepthAttention, DepthWeightedAverage,
                                         MultiwayDynamicDense, aggregator_class, build_aggregator,
                                         build_dense_connections)
from fairseq_capsagg.models.aggregating_stack import AggregationPlan
from blocks import encoder_and_embedding, randomise, reference_block
from helpers import build_tiny_model, fixed_batch_logits, parse_model_args, random_tokens

PEERS = {"dwa": [], "depth-attention": [], "depth-attention dynamic": ["--depth-attention-query", "dynamic"],
         "mudd": []}
FAMILY = {"dwa": "dwa", "depth-attention": "depthattn", "mudd": "mudd"}
NORMS = {"post-norm": [], "pre-norm": ["--encoder-normalize-before", "--decoder-normalize-before"]}


def rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + 1e-6)


def reference(connection, layers: List[torch.Tensor]) -> List[torch.Tensor]:
    """Each stream of a connection, one position at a time, as its paper writes it."""
    t_len, b_len, d = layers[0].shape
    streams = [torch.zeros(t_len, b_len, d) for _ in range(connection.streams)]
    for t in range(t_len):
        for b in range(b_len):
            h = [layer[t, b] for layer in layers]
            if isinstance(connection, DepthWeightedAverage):  # DenseFormer's DWA
                streams[0][t, b] = sum(a * h_l for a, h_l in zip(connection.weight, h))
            elif isinstance(connection, DepthAttention):  # attention residuals, gated
                keys = [rms(h_l) for h_l in h]
                if connection.query_kind == "static":
                    query = connection.query
                else:
                    query = connection.query_proj.weight @ keys[-1] + connection.query_proj.bias
                logits = torch.stack([query @ k for k in keys])
                alpha = [math.exp(v) for v in logits.tolist()]
                attended = sum(a / sum(alpha) * h_l for a, h_l in zip(alpha, h))
                streams[0][t, b] = h[-1] + connection.gate * (attended - h[-1])
            else:  # MUDDFormer's dynamic dense weights
                hidden = F.gelu(connection.fc1.weight @ rms(h[-1]))
                w = (connection.fc2.weight @ hidden).view(connection.streams, len(h)) + connection.static_weight
                for s in range(connection.streams):
                    streams[s][t, b] = sum(w[s, l] * h[l] for l in range(len(h)))
    return streams


def peer_settings(peer: str):
    """The settings dataclass of a peer with its case's flags, read as the model reads them."""
    name = peer.split()[0]
    args = parse_model_args(f"transformer_{FAMILY[name]}_small", PEERS[peer])
    return aggregator_class(name).Settings.from_values(vars(args))


@pytest.mark.parametrize("peer", PEERS)
def test_output_placement_matches_the_papers_loops(peer):
    name = peer.split()[0]
    aggregator = build_aggregator(name, 8, 4, peer_settings(peer))
    randomise(aggregator)
    layers = [torch.randn(3, 2, 8) for _ in range(4)]
    with torch.no_grad():
        got = aggregator(layers)
        expected = reference(aggregator, layers)[0]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("peer", PEERS)
def test_fresh_peers_return_the_top_layer_exactly(peer):
    name = peer.split()[0]
    layers = [torch.randn(3, 2, 8) for _ in range(4)]
    assert torch.equal(build_aggregator(name, 8, 4, peer_settings(peer))(layers), layers[-1])
    for connection in build_dense_connections(name, 8, 3, peer_settings(peer)):
        out = connection(layers[:connection.num_layers])
        expected = layers[connection.num_layers - 1]
        assert torch.equal(out, expected.expand_as(out))


def test_mudd_feeds_four_streams_except_after_the_top_block():
    connections = build_dense_connections("mudd", 8, 4)
    assert [(c.num_layers, c.streams) for c in connections] == [(2, 4), (3, 4), (4, 4), (5, 1)]
    assert build_aggregator("mudd", 8, 4).streams == 1


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("peer", PEERS)
def test_between_blocks_matches_a_loop_over_the_blocks(peer, norm):
    """X_i = Connection_i(B_0..B_i) is block i + 1's input; X_L, normalised, is the encoder's output."""
    name = peer.split()[0]
    model, dictionary = build_tiny_model(f"transformer_{FAMILY[name]}_base", PEERS[peer] + NORMS[norm])
    encoder = model.encoder
    randomise(encoder.dense_connections, seed=3)
    got, x, padding_mask = encoder_and_embedding(encoder, dictionary)
    with torch.no_grad():
        outputs, streams = [x], [x] * 4
        for layer, connection in zip(encoder.layers, encoder.dense_connections.connections):
            outputs.append(reference_block(layer, streams, padding_mask))
            mixed = reference(connection, outputs)
            streams = mixed if len(mixed) == 4 else mixed * 4
        expected = streams[3]
        if encoder.layer_norm is not None:
            expected = encoder.layer_norm(expected)
    real = ~padding_mask.t()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["dwa", "depthattn", "mudd"])
def test_a_fresh_densely_connected_model_is_the_vanilla_transformer(family):
    for norm in NORMS.values():
        model, dictionary = build_tiny_model(f"transformer_{family}_base", norm)
        vanilla, _ = build_tiny_model(f"transformer_{family}_base", norm + [
            "--encoder-dense-connections", "none", "--decoder-dense-connections", "none"])
        # a vanilla state dict loads strictly: the connections keep their initial values
        model.load_state_dict(vanilla.state_dict(), strict=True)
        assert torch.equal(fixed_batch_logits(model, dictionary), fixed_batch_logits(vanilla, dictionary))


@pytest.mark.parametrize("family", ["dwa", "depthattn", "mudd"])
def test_every_connection_learns_from_the_first_update(family):
    model, dictionary = build_tiny_model(f"transformer_{family}_small")
    src = random_tokens(dictionary, [6, 3], seed=5)
    prev = random_tokens(dictionary, [5, 5], seed=6, bos=True)
    logits, _ = model.train()(src, src.ne(1).sum(1), prev)
    logits.logsumexp(-1).mean().backward()
    for side in (model.encoder, model.decoder):
        for connection in side.dense_connections.connections:
            first = {"dwa": connection.weight if family == "dwa" else None,
                     "depthattn": getattr(connection, "gate", None),
                     "mudd": getattr(connection, "fc2", None) and connection.fc2.weight}[family]
            assert first.grad is not None and first.grad.abs().sum() > 0


def test_depth_attention_and_mudd_weights_are_fp32_under_half_precision():
    layers = torch.randn(4, 3, 2, 8).to(torch.bfloat16)
    attention = DepthAttention(8, 4, "dynamic")
    mudd = MultiwayDynamicDense(8, 4, 16, streams=4)
    randomise(attention)
    randomise(mudd)
    attention, mudd = attention.to(torch.bfloat16), mudd.to(torch.bfloat16)
    alpha = attention.mixing(layers)
    assert alpha.dtype == torch.float32
    torch.testing.assert_close(alpha.sum(0), torch.ones(3, 2))
    assert mudd.effective_weights(layers).dtype == torch.float32
    out = attention(list(layers))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    expected = reference(attention.float(), [layer.float() for layer in layers])[0]
    torch.testing.assert_close(out.float(), expected, rtol=0.05, atol=0.05)


def test_half_precision_model_stays_finite_and_close():
    model, dictionary = build_tiny_model("transformer_depthattn_small")
    randomise(model.encoder.dense_connections, seed=1)
    randomise(model.decoder.dense_connections, seed=2)
    src = random_tokens(dictionary, [6, 3], seed=5)
    prev = random_tokens(dictionary, [5, 5], seed=6, bos=True)
    with torch.no_grad():
        expected, _ = model(src, src.ne(1).sum(1), prev)
        got, _ = model.to(torch.bfloat16)(src, src.ne(1).sum(1), prev)
    assert torch.isfinite(got).all()
    assert (got.float().softmax(-1) - expected.softmax(-1)).abs().max() < 0.05


def test_dense_connections_and_output_aggregation_compose():
    model, dictionary = build_tiny_model("transformer_dwa_small", ["--encoder-aggregation", "em-routing"])
    assert model.encoder.dense_connections is not None and model.encoder.aggregator is not None
    src = random_tokens(dictionary, [6, 3], seed=5)
    prev = random_tokens(dictionary, [5, 5], seed=6, bos=True)
    logits, _ = model(src, src.ne(1).sum(1), prev)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("extra,pattern", [
    (["--mudd-hidden-dim", "0"], "--mudd-hidden-dim: got 0; it must be a positive integer"),
    (["--encoder-layerdrop", "0.2"], "--encoder-layerdrop must be 0 with --encoder-dense-connections mudd"),
    (["--checkpoint-activations"], "--checkpoint-activations cannot be combined with --encoder-dense-connections mudd"),
])
def test_impossible_dense_settings_are_refused_before_building(extra, pattern):
    with pytest.raises(AggregationConfigError, match=pattern):
        build_tiny_model("transformer_mudd_base", extra)


def test_an_aggregator_that_cannot_connect_blocks_is_refused_with_the_allowed_values():
    allowed = (r"'em-routing' cannot connect blocks; choose one of none, dwa, depth-attention, mudd, dlcl, "
               r"hyper-connections, mhc")
    with pytest.raises(AggregationConfigError, match=f"^{allowed}$"):  # the registry knows no flags
        build_dense_connections("em-routing", 8, 3, side="decoder")
    args = parse_model_args("transformer_dwa_small")
    args.decoder_dense_connections = "em-routing"  # past the parser's choices: the model names the flag
    with pytest.raises(AggregationConfigError, match=f"^--decoder-dense-connections: {allowed}$"):
        AggregationPlan.from_args(args)
    with pytest.raises(SystemExit):
        parse_model_args("transformer_dwa_small", ["--encoder-dense-connections", "linear"])


def test_mudd_refuses_cross_self_attention():
    with pytest.raises(AggregationConfigError, match="--cross-self-attention"):
        build_tiny_model("transformer_mudd_base", ["--cross-self-attention"])


@pytest.mark.parametrize("peer", PEERS)
def test_effective_weights_are_what_the_aggregate_sums(peer):
    """The depth-weights analysis reads effective_weights: Omega_s = sum_l w_{s,l} H^l exactly."""
    name = peer.split()[0]
    settings = peer_settings(peer)
    for connection in [build_aggregator(name, 8, 4, settings), *build_dense_connections(name, 8, 3, settings)]:
        randomise(connection, seed=7)
        layers = [torch.randn(3, 2, 8) for _ in range(connection.num_layers)]
        with torch.no_grad():
            out = connection(layers)
            weights = connection.effective_weights(connection.stack(layers))
        assert weights.shape == (3, 2, connection.streams, connection.num_layers)
        summed = torch.einsum("tbsl,ltbc->stbc", weights, torch.stack(layers))
        torch.testing.assert_close(summed if connection.streams > 1 else summed[0], out, rtol=1e-5, atol=1e-5)
