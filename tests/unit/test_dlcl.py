"""DLCL (Wang et al. 2019): a learned combination of the layer-normalised outputs of the embedding and all
earlier layers, starting as their uniform average; against a loop written from the paper."""

import pytest
import torch

from blocks import encoder_and_embedding, randomise, reference_block
from fairseq_capsagg.aggregators import DynamicLinearCombination, build_aggregator, build_dense_connections
from helpers import build_tiny_model

NORMS = {"post-norm": [], "pre-norm": ["--encoder-normalize-before", "--decoder-normalize-before"]}


def loop_reference(connection: DynamicLinearCombination, layers):
    """x = sum_k W_k LN_k(y_k), one position at a time."""
    t_len, b_len, d = layers[0].shape
    out = torch.zeros(t_len, b_len, d)
    for t in range(t_len):
        for b in range(b_len):
            out[t, b] = sum(w * norm(layer[t, b]) for w, norm, layer in zip(connection.weight, connection.norms, layers))
    return out


def test_it_starts_as_the_uniform_average_of_the_normalised_layers():
    dlcl = build_aggregator("dlcl", 8, 4)
    torch.testing.assert_close(dlcl.weight, torch.full((4,), 0.25), rtol=0, atol=0)
    layers = [3 * torch.randn(3, 2, 8) + k for k in range(4)]
    mean = sum(torch.nn.functional.layer_norm(layer, (8,)) for layer in layers) / 4
    torch.testing.assert_close(dlcl(layers), mean, rtol=1e-5, atol=1e-5)
    assert not DynamicLinearCombination.starts_as_transformer


def test_the_output_placement_matches_the_papers_loop():
    dlcl = build_aggregator("dlcl", 8, 4)
    randomise(dlcl, seed=2)
    layers = [torch.randn(3, 2, 8) for _ in range(4)]
    with torch.no_grad():
        torch.testing.assert_close(dlcl(layers), loop_reference(dlcl, layers), rtol=1e-5, atol=1e-5)


def test_each_layer_output_is_normalised_once_for_every_connection_that_reads_it():
    connections = build_dense_connections("dlcl", 8, 3)
    assert [c.num_layers for c in connections] == [2, 3, 4]
    assert all(c.norms[k] is connections[-1].norms[k] for c in connections for k in range(c.num_layers))
    params = torch.nn.ModuleList(connections).parameters()
    assert sum(p.numel() for p in params) == 4 * 2 * 8 + (2 + 3 + 4)  # 4 shared LayerNorms, 9 weights


@pytest.mark.parametrize("norm", NORMS)
def test_between_blocks_matches_a_loop_over_the_blocks(norm):
    model, dictionary = build_tiny_model("transformer_dlcl_base", NORMS[norm])
    encoder = model.encoder
    randomise(encoder.dense_connections, seed=3)
    got, x, padding_mask = encoder_and_embedding(encoder, dictionary)
    with torch.no_grad():
        outputs = [x]
        for layer, connection in zip(encoder.layers, encoder.dense_connections.connections):
            outputs.append(reference_block(layer, [x] * 4, padding_mask))
            x = loop_reference(connection, outputs)
        expected = encoder.layer_norm(x) if encoder.layer_norm is not None else x
    real = ~padding_mask.t()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-5)


def test_between_blocks_each_output_is_normalised_once_a_pass():
    """Connection l reads l + 1 outputs, but each LayerNorm runs once per forward pass (L + 1 in all, not
    (L + 1)(L + 2)/2 - 1), and a second pass normalises its own outputs again."""
    model, dictionary = build_tiny_model("transformer_dlcl_base", NORMS["pre-norm"])
    encoder = model.encoder
    calls = []
    for norm in encoder.dense_connections.connections[-1].norms:
        norm.register_forward_hook(lambda module, args, out: calls.append(module))
    first, _, _ = encoder_and_embedding(encoder, dictionary)
    assert len(calls) == len(encoder.layers) + 1 and len(set(map(id, calls))) == len(calls)
    second, _, _ = encoder_and_embedding(encoder, dictionary)
    assert len(calls) == 2 * (len(encoder.layers) + 1)
    torch.testing.assert_close(second, first, rtol=0, atol=0)
