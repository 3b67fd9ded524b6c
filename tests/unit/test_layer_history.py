"""Connections between blocks read their layers from one buffer written once per layer
(aggregators/layer_history.py): the stack's values and gradients, bit for bit, each layer output held once (counted by
benchmarks/memory.py), and a stack per connection no more."""

import pytest
import torch
from kernels import KernelCounter  # benchmarks/, on the path from tests/conftest.py
from memory import PeakMemory

from fairseq_capsagg.models import dense_connections
from fairseq_capsagg.aggregators.layer_history import LayerHistory, weighted_sum
from blocks import StackPerConnection
from helpers import build_tiny_model, random_tokens

LAYER = (5, 2, 8)  # (T, B, C)
#: The families whose connections are weighted sums of their stacks (layer_history.weighted_sum).
WEIGHTED_SUMS = ("dwa", "dlcl")


def gated_tensordot(weight, stacked):
    """A connection reading its stack through two operators: a weighted sum and its newest layer."""
    return torch.tensordot(weight.to(stacked.dtype), stacked, dims=1) * torch.sigmoid(stacked[-1])


def gated_weighted_sum(weight, stacked):
    return weighted_sum(weight, stacked) * torch.sigmoid(stacked[-1])


#: Connections: the stack read by other operators (its gradient added into G by the history), by weighted_sum
#: alone (w_l dX added by weighted_sum's backward) and by both.
CONNECTIONS = {"tensordot": gated_tensordot, "weighted_sum": weighted_sum, "both": gated_weighted_sum}


def chain(history_type, connection=gated_tensordot, blocks: int = 3, seed: int = 0, dtypes=None):
    """A densely connected chain written out: B_0 = x, B_i = tanh(W_i X_{i-1}), X_i = ``connection``(a_i, stack)
    of the stacks ``history_type`` gives; the top X, the parameters."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(LAYER, generator=generator).requires_grad_()
    weights = [torch.randn(8, 8, generator=generator).div(3).requires_grad_() for _ in range(blocks)]
    mixes = [torch.randn(block + 2, generator=generator).requires_grad_() for block in range(blocks)]
    dtypes = dtypes or [torch.float32] * (blocks + 1)
    history = history_type(blocks + 1)
    mixed = x
    for block in range(blocks):
        newest = torch.tanh(mixed @ weights[block]).to(dtypes[block + 1])
        stacked = history.extend([x.to(dtypes[0]), newest] if block == 0 else [newest])
        mixed = connection(mixes[block], stacked).float()
    return mixed, [x, *weights, *mixes]


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_the_stacks_and_every_gradient_are_a_stack_per_connections(connection):
    """Bit for bit; a weighted sum's gradient within a rounding (w_l dX and G added in one)."""
    results = []
    for history_type in (StackPerConnection, LayerHistory):
        out, params = chain(history_type, CONNECTIONS[connection])
        grads = torch.autograd.grad((out * torch.arange(out.numel()).view(out.shape)).sum(), params)
        results.append((out.detach(), grads))
    (expected, expected_grads), (got, got_grads) = results
    assert torch.equal(got, expected)
    for g, e in zip(got_grads, expected_grads):
        if connection == "tensordot":
            assert torch.equal(g, e)
        else:
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6 * float(e.abs().max()))


@pytest.mark.parametrize("connection", CONNECTIONS)
def test_the_gradients_are_numerically_right(connection):
    def top(x, w1, w2, a1, a2):
        history = LayerHistory(3)
        x1 = CONNECTIONS[connection](a1, history.extend([x, torch.tanh(x @ w1)]))
        return CONNECTIONS[connection](a2, history.extend([torch.tanh(x1 @ w2)]))
    generator = torch.Generator().manual_seed(1)
    inputs = (torch.randn(2, 3, generator=generator), torch.randn(3, 3, generator=generator),
              torch.randn(3, 3, generator=generator), torch.randn(2, generator=generator),
              torch.randn(3, generator=generator))
    torch.autograd.gradcheck(top, tuple(x.double().requires_grad_() for x in inputs))


def test_a_weighted_sum_adds_its_gradient_in_one_pass_over_the_stack():
    """weighted_sum's backward on a history's stack moves less than the sum's own backward and G's add: G_l +=
    w_l dX reads G and dX and writes G, where the product w_l dX is written, then read with G (the traffic
    benchmarks/kernels.py counts)."""
    moved = {}
    for name in ("tensordot", "weighted_sum"):
        out, _ = chain(LayerHistory, lambda w, s: CONNECTIONS[name](w, s) if name != "tensordot"
                       else torch.tensordot(w, s, dims=1), blocks=6)
        with KernelCounter() as counter:
            out.sum().backward()
        moved[name] = counter.bytes_moved
    layer_bytes = 4 * torch.Size(LAYER).numel()
    assert moved["tensordot"] - moved["weighted_sum"] >= 2 * sum(range(2, 7)) * layer_bytes


def test_layers_of_mixed_precision_are_stacked_promoted_and_get_gradients_in_their_own():
    """As torch.stack: a bf16 embedding and fp32 blocks stack in fp32, and the other way round; each layer's
    gradient comes back in its dtype. The values are the stack's; the gradients the stack's within bf16's precision:
    a bf16 layer's shares are added in fp32 and rounded once (the stack rounds each connection's share)."""
    for dtypes in ([torch.bfloat16] + [torch.float32] * 3, [torch.float32] + [torch.bfloat16] * 2 + [torch.float32]):
        results = []
        for history_type in (StackPerConnection, LayerHistory):
            out, params = chain(history_type, gated_weighted_sum, dtypes=dtypes)
            results.append((out.detach(), torch.autograd.grad(out.sum(), params)))
        assert torch.equal(results[1][0], results[0][0])
        for g, e in zip(results[1][1], results[0][1]):
            assert g.dtype == e.dtype
            torch.testing.assert_close(g, e, rtol=2e-2, atol=2e-2)


def test_a_stack_an_operator_saved_is_not_marked_changed_by_the_later_layers():
    """Writing slot i + 1 leaves slots 0..i as they were, and autograd's version check agrees: the sigmoid saved
    connection 0's stack, which a second write follows, and its backward runs."""
    history = LayerHistory(3)
    first = history.extend([torch.ones(LAYER, requires_grad=True), torch.ones(LAYER, requires_grad=True)])
    saved = first.sigmoid()
    version = first._version
    history.extend([torch.full(LAYER, 2.0, requires_grad=True)])
    assert first._version == version and torch.equal(first, torch.ones(2, *LAYER))
    saved.sum().backward()


def test_more_layers_than_the_stack_holds_or_of_another_shape_are_refused():
    history = LayerHistory(2)
    history.extend([torch.zeros(LAYER)])
    with pytest.raises(ValueError, match=r"layer outputs of shape \(5, 2, 7\) and \(5, 2, 8\) cannot be stacked"):
        history.extend([torch.zeros(5, 2, 7)])
    history.extend([torch.zeros(LAYER)])
    with pytest.raises(RuntimeError, match="a stack of 2 layer outputs was given 3"):
        history.extend([torch.zeros(LAYER)])


@pytest.mark.parametrize("family", ["dwa", "dlcl", "depthattn", "mudd"])
@pytest.mark.parametrize("kernel", ["eager", "fused"])
def test_a_densely_connected_model_trains_as_with_a_stack_per_connection_and_holds_less(family, kernel, monkeypatch):
    """Bit for bit the logits and gradients of a stack per connection (within a rounding for the weighted sums);
    at the end of the forward a stack of N
    blocks holds N(N + 3)/2 - (N + 1) fewer layer outputs a side: the connection after block i saved its stack of
    i + 2, now the N + 1 layer outputs are held once, in the buffer (DLCL's: the normalised outputs)."""
    model, dictionary = build_tiny_model(f"transformer_{family}_base", [
        "--connection-kernels", kernel, "--encoder-normalize-before", "--decoder-normalize-before"])
    model.train()
    src, prev = random_tokens(dictionary, [6, 6], seed=5), random_tokens(dictionary, [6, 6], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    held, grads = {}, {}
    for history_type in (StackPerConnection, LayerHistory):
        monkeypatch.setattr(dense_connections, "LayerHistory", history_type)
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # the same dropout
        with PeakMemory() as memory:
            logits = model(src, lengths, prev)[0]
        held[history_type] = memory.live
        logits.pow(2).sum().backward()
        grads[history_type] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
        del logits
    expected, got = grads[StackPerConnection], grads[LayerHistory]
    assert torch.equal(got[0], expected[0])
    scale = max(float(grad.abs().max()) for grad in expected[1].values())
    for name, grad in expected[1].items():
        if family in WEIGHTED_SUMS:  # w_l dX added into G in one rounding, not two
            torch.testing.assert_close(got[1][name], grad, rtol=1e-5, atol=1e-6 * scale, msg=name)
        else:
            assert torch.equal(got[1][name], grad), name
    blocks = len(model.encoder.layers)
    layer_bytes = src.numel() * model.encoder.embed_tokens.embedding_dim * 4
    assert held[StackPerConnection] - held[LayerHistory] == \
        2 * (blocks * (blocks + 3) // 2 - (blocks + 1)) * layer_bytes
