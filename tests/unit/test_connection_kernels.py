"""--connection-kernels: the fused operators (a hyper-connection's read, mHC's read, its Sinkhorn-Knopp alone and
with its blend, the streams' write, a block's write with the next block's read, attention over depth's and MUDD's
aggregates, the routing iterations and EM routing's input activations) compute what their eager references do,
values and gradients, alone and in models of their families (on the CPU the fused operators run the references
and their written-out backwards inside; their Triton kernels are tests/unit/test_triton_kernels.py's, the models
through them tests/integration/test_launched_models.py's)."""

import pytest
import torch
from kernels import KernelCounter  # benchmarks/, on the path from tests/conftest.py

from fairseq_capsagg.aggregators import (DepthAttention, DynamicRouting, EMRouting, HyperConnections,
                                         ManifoldHyperConnections, MultiwayDynamicDense, sinkhorn)
from fairseq_capsagg.aggregators.ops.depth_softmax import depth_softmax
from fairseq_capsagg.aggregators.ops.dynamic_route import dynamic_route
from fairseq_capsagg.aggregators.ops.em_route import em_route
from fairseq_capsagg.aggregators.ops.dispatch import runs_fused
from fairseq_capsagg.aggregators.ops.hyper_read import hyper_read
from fairseq_capsagg.aggregators.ops.input_activation import input_activation
from fairseq_capsagg.aggregators.ops.write_read import hyper_write_read, mhc_write_read
from fairseq_capsagg.aggregators.ops.mhc_read import mhc_read
from fairseq_capsagg.aggregators.ops.mudd_aggregate import mudd_aggregate
from fairseq_capsagg.aggregators.ops.sinkhorn import mhc_mix
from fairseq_capsagg.aggregators.ops.stream_write import stream_write
from helpers import build_tiny_model, random_tokens

# the fused backward sums its products in another order than autograd's
TOLERANCE = dict(rtol=1e-5, atol=1e-6)
TOLERANCE_BY_DTYPE = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5)}


def assert_close_at_precision(got: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype) -> None:
    """``got``, computed in ``dtype``, against the fp32 ``exact`` of the same (bf16-representable) inputs and
    cotangents: in bf16 within 2^-7 of the tensor's scale, in fp32 to rounding."""
    scale = dict(atol=1e-2 * exact.abs().max().item()) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(got.float(), exact, **{**TOLERANCE_BY_DTYPE[dtype], **scale})


def test_the_fused_sinkhorn_equals_the_eager_loop_with_its_gradient():
    for shape in [(3, 2, 4, 4), (7, 5, 3, 3)]:
        logits = (3 * torch.randn(shape, generator=torch.Generator().manual_seed(shape[0]))).requires_grad_()
        weights = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        expected = sinkhorn(logits, kernel="eager")
        (grad,) = torch.autograd.grad((expected * weights).sum(), logits)
        got = sinkhorn(logits, kernel="fused")
        (fused_grad,) = torch.autograd.grad((got * weights).sum(), logits)
        assert got.is_contiguous() and got.dtype == torch.float32 and got.shape == shape
        torch.testing.assert_close(got, expected, **TOLERANCE)
        torch.testing.assert_close(fused_grad, grad, **TOLERANCE)


@pytest.mark.parametrize("per_position", [True, False], ids=["dynamic weights", "static weights"])
def test_the_fused_write_equals_the_reference_with_every_gradient(per_position):
    generator = torch.Generator().manual_seed(3)
    t, b, n, c = 5, 2, 4, 6
    weights_shape = (t, b) if per_position else ()
    inputs = [torch.randn(t, b, n, c, generator=generator), torch.randn(*weights_shape, n, n, generator=generator),
              torch.randn(*weights_shape, n, generator=generator), torch.randn(t, b, c, generator=generator),
              torch.randn(t, b, c, generator=generator), torch.randn(n, generator=generator)]
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out, state = stream_write(*leaves, kernel=kernel)
        (out * (1 + out.detach())).sum().backward(retain_graph=True)
        (state * torch.cos(state.detach())).sum().backward()
        results[kernel] = (out.detach(), state.detach()), [leaf.grad for leaf in leaves]
    for fused, eager in zip(results["fused"][0], results["eager"][0]):
        torch.testing.assert_close(fused, eager, **TOLERANCE)
    for fused, eager in zip(results["fused"][1], results["eager"][1]):
        torch.testing.assert_close(fused, eager, **TOLERANCE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_hyper_read_equals_the_reference_with_every_gradient(dtype):
    """In bf16 against the reference on the same values in fp32 (the operator computes in fp32 and rounds each
    output once, where autograd's bf16 graph rounds every branch of the streams' gradient)."""
    generator = torch.Generator().manual_seed(11)
    n, c = 3, 10
    inputs = [2 * torch.randn(5, 2, n, c, generator=generator), torch.randn(n + 2, c, generator=generator),
              torch.randn(n, generator=generator), torch.randn(n, n, generator=generator),
              torch.randn(n, generator=generator), torch.tensor(0.3), torch.tensor(-0.7)]
    inputs = [x.to(dtype) for x in inputs]  # the weights too, as in a model cast to bf16 (fairseq's --bf16)
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [(x.float() if kernel == "eager" else x).clone().requires_grad_() for x in inputs]
        outputs = hyper_read(*leaves, kernel=kernel)
        cotangents = [torch.randn(out.shape, generator=torch.Generator().manual_seed(out.dim())).to(dtype).float()
                      for out in outputs]  # what reaches a bf16 output is bf16: the same values for both
        sum((out.float() * cotangent).sum() for out, cotangent in zip(outputs, cotangents)).backward()
        results[kernel] = outputs, [leaf.grad for leaf in leaves]
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager, dtype)
    for fused, eager in zip(results["fused"][0], results["eager"][0]):
        assert fused.shape == eager.shape
        assert_close_at_precision(fused, eager, dtype)
    assert [out.dtype for out in results["fused"][0]] == [dtype, torch.float32, torch.float32]


def _read_weights(family: str, n: int, c: int, generator: torch.Generator):
    """The next connection's read weights and the arguments after them: a hyper-connection's W, A_m, A_r, B, s_a,
    s_b; mHC's phi, b_pre, b_post, b_res, alpha, the gate (inside its clamp), the home stream and whether the gate is
    shared."""
    if family == "hc":
        return [torch.randn(n + 2, c, generator=generator), torch.randn(n, generator=generator),
                torch.randn(n, n, generator=generator), torch.randn(n, generator=generator), torch.tensor(0.3),
                torch.tensor(-0.7)], ()
    return [torch.randn(2 * n + n * n, n * c, generator=generator), torch.randn(n, generator=generator),
            torch.randn(n, generator=generator), torch.randn(n, n, generator=generator),
            torch.randn(3, generator=generator), torch.tensor(0.6)], (1, False)


#: Per family: the write and the next read as one operator, and the read's operator alone.
WRITE_READ = {"hc": (hyper_write_read, hyper_read), "mhc": (mhc_write_read, mhc_read)}


@pytest.mark.parametrize("family", sorted(WRITE_READ))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_write_and_read_equal_the_write_then_the_read_with_every_gradient(family, dtype):
    """The write's operator, then the read's of what it wrote, on the same values in the same precision (each of those
    is held to its eager reference here); every output takes a gradient (the state's only the top block's in a
    model). The forward is theirs exactly; the backward adds the read's gradient of H' to the one from above before
    rounding it once, where autograd rounds both and their sum."""
    generator = torch.Generator().manual_seed(17)
    t, b, n, c = 5, 2, 3, 10
    inputs = [2 * torch.randn(t, b, n, c, generator=generator), torch.randn(t, b, n, n, generator=generator),
              torch.randn(t, b, n, generator=generator), torch.randn(t, b, c, generator=generator),
              torch.randn(t, b, c, generator=generator), torch.randn(n, generator=generator)]
    weights, after = _read_weights(family, n, c, generator)
    # the model's precision for the streams, the block's tensors and the weights; the write's r and b are fp32
    inputs = [x if k in (1, 2) else x.to(dtype) for k, x in enumerate(inputs + weights)]
    together, read = WRITE_READ[family]
    results = {}
    for fused in (True, False):
        leaves = [x.clone().requires_grad_() for x in inputs]
        if fused:
            outputs = together(*leaves, *after)
        else:
            written = stream_write(*leaves[:6], kernel="fused")
            outputs = (*written, *read(written[0], *leaves[6:], *after, kernel="fused"))
        cotangents = [torch.randn(out.shape, generator=torch.Generator().manual_seed(k)).to(out.dtype)
                      for k, out in enumerate(outputs)]
        torch.autograd.backward(outputs, cotangents)
        results[fused] = outputs, [leaf.grad for leaf in leaves]
    for got, want in zip(results[True][0], results[False][0]):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    for got, want, leaf in zip(results[True][1], results[False][1], inputs):
        assert got.dtype == leaf.dtype
        assert_close_at_precision(got, want.float(), dtype)


def test_the_fused_write_keeps_the_identity_start_exact():
    """r = I, b = 1, streams that are copies of h and a one-hot readout: every stream and the state become exactly
    y, as in the reference."""
    h, y = torch.randn(4, 3, 8), torch.randn(4, 3, 8)
    streams = h.unsqueeze(2).expand(4, 3, 2, 8).contiguous()
    out, state = stream_write(streams, torch.eye(2), torch.ones(2), h, y, torch.tensor([0.0, 1.0]), kernel="fused")
    assert torch.equal(out, y.unsqueeze(2).expand_as(out)) and torch.equal(state, y)


#: The forward operators each family runs with --connection-kernels fused.
FUSED_OPS = {"hc": {"capsagg.hyper_read", "capsagg.hyper_write_read", "capsagg.stream_write"},
             "mhc": {"capsagg.mhc_read", "capsagg.mhc_mix", "capsagg.mhc_write_read", "capsagg.stream_write"},
             "depthattn": {"capsagg.depth_softmax"}, "mudd": {"capsagg.mudd_aggregate"},
             "emrouting": {"capsagg.em_route", "capsagg.input_activation"}, "dynrouting": {"capsagg.dynamic_route"}}


@pytest.mark.parametrize("family,cls", [("hc", HyperConnections), ("mhc", ManifoldHyperConnections),
                                        ("depthattn", DepthAttention), ("mudd", MultiwayDynamicDense),
                                        ("emrouting", EMRouting), ("dynrouting", DynamicRouting)])
def test_a_model_computes_what_the_eager_one_does_with_the_fused_kernels(family, cls):
    eager, dictionary = build_tiny_model(f"transformer_{family}_base", ["--connection-kernels", "eager"])
    fused, _ = build_tiny_model(f"transformer_{family}_base", ["--connection-kernels", "fused"])
    assert {c.kernels for c in fused.modules() if isinstance(c, cls)} == {"fused"}
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # away from the start, where every H_res is the identity whatever Sinkhorn does
        for name, p in eager.named_parameters():
            if ".dense_connections." in name or ".aggregator." in name:
                p.add_(0.5 * torch.randn(p.shape, generator=generator))
    fused.load_state_dict(eager.state_dict())
    src, prev = random_tokens(dictionary, [6, 3], seed=5), random_tokens(dictionary, [5, 5], seed=6, bos=True)
    lengths = src.ne(dictionary.pad()).sum(1)
    with KernelCounter() as counter:
        got = fused(src, lengths, prev)[0]
    expected = eager(src, lengths, prev)[0]
    fused_ops = {name for name in counter.counts if name.startswith("capsagg.")}
    assert fused_ops == FUSED_OPS[family]  # every part of the family that has an operator runs it
    torch.testing.assert_close(got, expected, **TOLERANCE)
    expected.pow(2).sum().backward()
    got.pow(2).sum().backward()
    # gradients that are zero but for rounding (the keys' biases) are compared on the model's gradient scale
    atol = max(1e-5, 1e-6 * max(p.grad.abs().max().item() for p in eager.parameters()))
    for (name, p), q in zip(eager.named_parameters(), fused.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=atol, msg=name)


@pytest.mark.parametrize("query_shape", [(8,), (5, 2, 8)], ids=["static query", "dynamic query"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_depth_softmax_equals_the_reference_with_every_gradient(query_shape, dtype):
    generator = torch.Generator().manual_seed(13)
    inputs = [2 * torch.randn(4, 5, 2, 8, generator=generator), torch.randn(query_shape, generator=generator),
              torch.tensor(0.7)]
    inputs = [x.to(dtype) for x in inputs]  # the query and gate too, as in a model cast to bf16 (fairseq's --bf16)
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [(x.float() if kernel == "eager" else x).clone().requires_grad_() for x in inputs]
        out = depth_softmax(*leaves, kernel=kernel)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(dtype).float()
        (out.float() * cotangent).sum().backward()
        results[kernel] = out, [leaf.grad for leaf in leaves]
    assert results["fused"][0].dtype == dtype and results["fused"][0].shape == (5, 2, 8)
    assert_close_at_precision(results["fused"][0], results["eager"][0], dtype)
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager, dtype)


@pytest.mark.parametrize("streams", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_mudd_aggregate_equals_the_reference_with_every_gradient(streams, dtype):
    generator = torch.Generator().manual_seed(17)
    inputs = [2 * torch.randn(3, 5, 2, 8, generator=generator), torch.randn(6, 8, generator=generator),
              torch.randn(streams * 3, 6, generator=generator), torch.randn(streams, 3, generator=generator)]
    inputs = [x.to(dtype) for x in inputs]  # the weights too, as in a model cast to bf16 (fairseq's --bf16)
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [(x.float() if kernel == "eager" else x).clone().requires_grad_() for x in inputs]
        out = mudd_aggregate(*leaves, kernel=kernel)
        cotangent = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(dtype).float()
        (out.float() * cotangent).sum().backward()
        results[kernel] = out, [leaf.grad for leaf in leaves]
    assert results["fused"][0].dtype == dtype and results["fused"][0].shape == (streams, 5, 2, 8)
    assert_close_at_precision(results["fused"][0], results["eager"][0], dtype)
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager, dtype)


def test_the_fused_depth_softmax_keeps_the_identity_start_exact():
    layers = torch.randn(3, 4, 2, 8)
    assert torch.equal(depth_softmax(layers, torch.randn(8), torch.tensor(0.0), kernel="fused"), layers[-1])


@pytest.mark.parametrize("gate,shared", [(0.6, False), (1.4, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_mhc_read_and_mix_equal_the_references_with_every_gradient(gate, shared, dtype):
    """The mended start's (H_post and H_res ungated) and a checkpoint's of the start before (one gate for all three,
    here above its clamp)."""
    generator = torch.Generator().manual_seed(19)
    n, c = 3, 6
    inputs = [2 * torch.randn(5, 2, n, c, generator=generator),
              torch.randn(2 * n + n * n, n * c, generator=generator), torch.randn(n, generator=generator),
              torch.randn(n, generator=generator), torch.randn(n, n, generator=generator),
              torch.randn(3, generator=generator), torch.tensor(gate)]
    inputs = [x.to(dtype) for x in inputs]  # the weights too, as in a model cast to bf16 (fairseq's --bf16)
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [(x.float() if kernel == "eager" else x).clone().requires_grad_() for x in inputs]
        block_input, res_logits, write = mhc_read(*leaves, home=1, shared_gate=shared, kernel=kernel)
        outputs = (block_input, mhc_mix(res_logits, leaves[-1] if shared else None, kernel=kernel), write)
        cotangents = [torch.randn(out.shape, generator=torch.Generator().manual_seed(out.dim())).to(dtype).float()
                      for out in outputs]
        sum((out.float() * cotangent).sum() for out, cotangent in zip(outputs, cotangents)).backward()
        results[kernel] = outputs, [leaf.grad for leaf in leaves]
    for fused, eager in zip(results["fused"][0], results["eager"][0]):
        assert fused.shape == eager.shape
        assert_close_at_precision(fused, eager, dtype)
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("capsule_dim", [1, 4])
def test_the_fused_em_routing_equals_the_loop_with_every_gradient(capsule_dim, dtype):
    """Votes and beta_A, beta_mu in the model's precision: the loop routes fp32 copies, the operator reads them as
    they are and returns each gradient in its input's precision."""
    generator = torch.Generator().manual_seed(23)
    inputs = [torch.randn(5, 2, 4, 8 // capsule_dim, capsule_dim, generator=generator).to(dtype),
              torch.rand(5, 2, 4, generator=generator), torch.randn(8 // capsule_dim, generator=generator).to(dtype),
              torch.randn(8 // capsule_dim, generator=generator).to(dtype)]
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = em_route(*leaves, 3, 1.0, kernel=kernel)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
        results[kernel] = out, [leaf.grad for leaf in leaves]
    assert results["fused"][0].dtype == torch.float32
    torch.testing.assert_close(results["fused"][0], results["eager"][0], **TOLERANCE)
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager.float(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_input_activations_equal_the_reference_with_every_gradient(dtype):
    """Capsules, W^H and b in the model's precision; the operator computes in fp32 and rounds each gradient once,
    where autograd's graph (the reference's) rounds the weights' gradients as it casts them back."""
    generator = torch.Generator().manual_seed(29)
    inputs = [torch.randn(5, 2, 4, 12, generator=generator).to(dtype),
              (torch.randn(4, 12, generator=generator) / 3).to(dtype), torch.randn(4, generator=generator).to(dtype)]
    results = {}
    for kernel in ("eager", "fused"):
        leaves = [x.clone().requires_grad_() for x in inputs]
        out = input_activation(*leaves, kernel=kernel)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
        results[kernel] = out, [leaf.grad for leaf in leaves]
    assert results["fused"][0].dtype == torch.float32 and results["fused"][0].shape == (5, 2, 4)
    torch.testing.assert_close(results["fused"][0], results["eager"][0], **TOLERANCE)
    for fused, eager, leaf in zip(results["fused"][1], results["eager"][1], inputs):
        assert fused.dtype == leaf.dtype
        assert_close_at_precision(fused, eager.float(), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("over_inputs", [False, True], ids=["softmax over outputs", "softmax over inputs"])
def test_the_fused_dynamic_routing_equals_the_loop_with_its_gradient(over_inputs, dtype):
    votes = (2 * torch.randn(5, 2, 4, 4, 2, generator=torch.Generator().manual_seed(29))).to(dtype)
    results = {}
    for kernel in ("eager", "fused"):
        leaf = votes.clone().requires_grad_()
        out = dynamic_route(leaf, 3, over_inputs, kernel=kernel)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(0))).sum().backward()
        results[kernel] = out, leaf.grad
    assert results["fused"][0].dtype == torch.float32 and results["fused"][1].dtype == dtype
    torch.testing.assert_close(results["fused"][0], results["eager"][0], **TOLERANCE)
    assert_close_at_precision(results["fused"][1], results["eager"][1].float(), dtype)


@pytest.mark.parametrize("cls", [DynamicRouting, EMRouting])
def test_in_bf16_the_fused_routing_saves_the_votes_and_capsules_once_in_bf16(cls):
    """What a routing aggregator in bf16 keeps for its backward: the stacked layers, the input capsules and the
    votes, each once and as the model made them (the operator reads the votes in place, the input activations
    promote the capsules as they read them); no fp32 copy of either, which the eager loop saves."""
    t, b, d, num_layers = 5, 2, 8, 4
    saved = {}
    for kernel in ("eager", "fused"):
        aggregator = cls(d, num_layers, output_capsules=4, routing_iters=2, kernels=kernel).to(torch.bfloat16)
        layers = [torch.randn(t, b, d, generator=torch.Generator().manual_seed(i)).to(torch.bfloat16)
                  .requires_grad_() for i in range(num_layers)]
        held = {p.untyped_storage().data_ptr() for p in aggregator.parameters()}
        tensors = []
        with torch.autograd.graph.saved_tensors_hooks(lambda x: tensors.append(x) or x, lambda x: x):
            aggregator(layers)
        # the tensors of all L layers' size: the stack, the capsules, the votes and what is made of them
        saved[kernel] = {(x.untyped_storage().data_ptr(), x.dtype) for x in tensors
                         if x.numel() == t * b * num_layers * d and x.untyped_storage().data_ptr() not in held}
    assert len(saved["fused"]) == 3 and {dtype for _, dtype in saved["fused"]} == {torch.bfloat16}
    assert torch.float32 in {dtype for _, dtype in saved["eager"]}


def test_by_default_the_fused_operators_run_where_their_triton_kernels_do():
    """``auto``: on CUDA with Triton; on a CPU the eager references, faster there than the operators that run them
    inside with their backward written out."""
    cpu = torch.zeros(1)
    assert runs_fused("fused", cpu) and not runs_fused("eager", cpu) and not runs_fused("auto", cpu)
    model, dictionary = build_tiny_model("transformer_hc_base")
    assert {c.kernels for c in model.modules() if isinstance(c, HyperConnections)} == {"auto"}
    src = random_tokens(dictionary, [4, 3], seed=1)
    with KernelCounter() as counter:
        model(src, src.ne(dictionary.pad()).sum(1), random_tokens(dictionary, [3, 3], seed=2, bos=True))
    assert not any(name.startswith("capsagg.") for name in counter.counts)
