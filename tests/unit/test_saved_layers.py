"""Connections between blocks save their stacked inputs as the layer outputs themselves
(aggregators/saved_layers.py): the same values and gradients, a copy of the early layers fewer per connection
(counted by benchmarks/memory.py), and autograd's guard against layers modified in place kept."""

import contextlib

import pytest
import torch
from memory import PeakMemory  # benchmarks/, on the path from tests/conftest.py

from fairseq_capsagg.aggregators.saved_layers import saved_as_layers
from helpers import build_tiny_model, random_tokens

LAYER = (5, 2, 8)  # (T, B, C)
LAYER_BYTES = 5 * 2 * 8 * 4


def layers_and_weight(count: int = 4):
    generator = torch.Generator().manual_seed(0)
    layers = [(torch.randn(LAYER, generator=generator) * 2).requires_grad_() for _ in range(count)]
    return layers, torch.randn(count, generator=generator).requires_grad_()


def weighted_sum(layers, weight, saved: bool) -> torch.Tensor:
    """A DWA-like connection reading its stack twice: whole (the weighted sum) and its top layer (a view)."""
    stacked = torch.stack(layers)
    with saved_as_layers(stacked, layers, 0) if saved else contextlib.nullcontext():
        return torch.tensordot(weight, stacked, dims=1) * torch.sigmoid(stacked[-1])


def test_the_values_and_every_gradient_are_the_stacks():
    results = []
    for saved in (False, True):
        layers, weight = layers_and_weight()
        out = weighted_sum(layers, weight, saved)
        grads = torch.autograd.grad((out * torch.arange(out.numel()).view(out.shape)).sum(), [*layers, weight])
        results.append((out.detach(), grads))
    (expected, expected_grads), (got, got_grads) = results
    assert torch.equal(got, expected)
    for g, e in zip(got_grads, expected_grads):
        assert torch.equal(g, e)


def test_first_and_second_order_gradients_are_numerically_right():
    layers, weight = layers_and_weight(3)
    inputs = (*layers, weight)
    torch.autograd.gradcheck(lambda *x: weighted_sum(list(x[:-1]), x[-1], True),
                             tuple(x.detach().double().requires_grad_() for x in inputs))
    torch.autograd.gradgradcheck(lambda *x: weighted_sum(list(x[:-1]), x[-1], True),
                                 tuple(x.detach().double().requires_grad_() for x in inputs))


def test_a_graph_kept_for_a_second_backward_differentiates_the_stack_then():
    """The first backward restacks the layers; a second one with ``create_graph`` differentiates through the
    stack autograd saved."""
    expected_layers, expected_weight = layers_and_weight()
    expected = weighted_sum(expected_layers, expected_weight, False)
    layers, weight = layers_and_weight()
    out = weighted_sum(layers, weight, True)
    torch.autograd.grad(out.sum(), weight, retain_graph=True)
    second = []
    for o, w, first_layer in ((expected, expected_weight, expected_layers[0]), (out, weight, layers[0])):
        (grad,) = torch.autograd.grad(o.sum(), w, create_graph=True)  # reads the saved stack
        second.append(torch.autograd.grad(grad.pow(2).sum(), first_layer)[0])
    assert torch.equal(second[1], second[0]) and second[0].abs().sum() > 0


def test_autograd_holds_the_layers_not_a_copy_of_them():
    """After the forward the stack is gone: what is held beyond the layers is the output and the sigmoid's."""
    held = {}
    for saved in (False, True):
        layers, weight = layers_and_weight()
        with PeakMemory() as memory:
            out = weighted_sum(layers, weight, saved)
        held[saved] = memory.live
        out.sum().backward()
        del out
    assert held[False] - held[True] == 4 * LAYER_BYTES  # the stack of four layers


def test_a_layer_modified_in_place_after_the_forward_is_refused_at_the_backward():
    layers, weight = layers_and_weight()
    out = weighted_sum(layers, weight, True)
    with torch.no_grad():
        layers[1].mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        out.sum().backward()


def test_a_stack_modified_in_place_is_saved_as_it_is():
    """An aggregator that changes its stack in place before an operator saves it gets the changed values back."""
    results = []
    for saved in (False, True):
        layers, weight = layers_and_weight()
        stacked = torch.stack(layers)
        with saved_as_layers(stacked, layers, 0) if saved else contextlib.nullcontext():
            stacked.mul_(3)
            out = torch.tensordot(weight, stacked, dims=1)
        results.append(torch.autograd.grad(out.sum(), weight)[0])
    assert torch.equal(results[1], results[0])


@pytest.mark.parametrize("family,held_anyway", [("dwa", 1), ("dlcl", 0), ("depthattn", 1), ("mudd", 1)])
@pytest.mark.parametrize("kernel", ["eager", "fused"])
def test_a_densely_connected_model_trains_as_with_the_copies_and_holds_less(family, held_anyway, kernel):
    """Bit for bit the logits and gradients of connections that save their stacks; at the end of the forward a pre-norm
    stack of N blocks holds N(N + 3)/2 - (N + 1) + ``held_anyway`` fewer layer outputs a side: the connection
    after block i saved i + 1 of them, now the N + 1 stacked inputs are held once, but for those held anyway (the
    embedding's output, the first block's input; DLCL stacks its own normalisations of each)."""
    model, dictionary = build_tiny_model(f"transformer_{family}_base", [
        "--connection-kernels", kernel, "--encoder-normalize-before", "--decoder-normalize-before"])
    model.train()
    src, prev = random_tokens(dictionary, [6, 6], seed=5), random_tokens(dictionary, [6, 6], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    connections = [c for side in (model.encoder, model.decoder) for c in side.dense_connections.connections]
    held, grads = {}, {}
    for saves_once in (False, True):
        for connection in connections:
            connection.saves_layers_once = saves_once
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout
        with PeakMemory() as memory:
            logits = model(src, lengths, prev)[0]
        held[saves_once] = memory.live
        logits.pow(2).sum().backward()
        grads[saves_once] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        del logits
    assert torch.equal(grads[True][0], grads[False][0])
    for name, grad in grads[False][1].items():
        assert torch.equal(grads[True][1][name], grad), name
    blocks = len(model.encoder.layers)
    layer_bytes = src.numel() * model.encoder.embed_tokens.embedding_dim * 4
    assert held[False] - held[True] == 2 * (blocks * (blocks + 3) // 2 - (blocks + 1) + held_anyway) * layer_bytes
