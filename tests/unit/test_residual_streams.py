"""Hyper-connections and mHC: the exact Transformer start, each block against a loop written from the
papers, Sinkhorn against a slow reference, fp32 under half precision, mHC's start (unsaturated, its H_res applied
and learning, the gate of H_pre, checkpoints of the start before), weight decay and the refusals."""

import pytest
import torch
from fairseq import optim
from fairseq.optim.adam import FairseqAdamConfig
from omegaconf import OmegaConf, open_dict

from fairseq_capsagg.aggregators import (AggregationConfigError, HyperConnections, ManifoldHyperConnections,
                                         build_dense_connections, sinkhorn)
from fairseq_capsagg.models.aggregating_stack import AggregationPlan
from fairseq_capsagg.patches.weight_decay import exempt_from_weight_decay
from blocks import encoder_and_embedding, reference_block
import stream_learning  # benchmarks/, on the path from tests/conftest.py
from helpers import TINY_SHAPE, build_tiny_model, fixed_batch_logits, parse_model_args, random_tokens

FAMILIES = {"hc": "hyper-connections", "mhc": "mhc"}
NONE = ["--encoder-dense-connections", "none", "--decoder-dense-connections", "none"]


def perturb(module: torch.nn.Module, seed: int = 0, scale: float = 0.3) -> None:
    """Moves every weight away from its start (the static weights keep their structure)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("streams", ["1", "2", "4"])
@pytest.mark.parametrize("weights", ["static", "dynamic"])
def test_a_fresh_model_is_exactly_the_pre_norm_transformer(family, streams, weights):
    flags = ["--residual-streams", streams, "--stream-weights", weights]
    model, dictionary = build_tiny_model(f"transformer_{family}_base", flags)
    vanilla, _ = build_tiny_model(f"transformer_{family}_base", flags + NONE)
    assert model.encoder.layers[0].normalize_before  # pre-norm at the base shape too
    vanilla.load_state_dict({k: v for k, v in model.state_dict().items() if ".dense_connections." not in k})
    got, want = fixed_batch_logits(model, dictionary), fixed_batch_logits(vanilla, dictionary)
    if family == "mhc" and int(streams) > 2:  # the copies mixed by H_res's rows, which sum to 1 to rounding
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    else:
        assert torch.equal(got, want)


def loop_reference(connection, streams: torch.Tensor, block) -> torch.Tensor:
    """One block of hyper-connections by position and stream, from the papers' equations: h = sum_i a_i H_i,
    H'_j = sum_i r_ij H_i + b_j F(h) with F(h) = block(h) - h."""
    T, B, n, C = streams.shape
    out = torch.zeros(streams.shape, dtype=torch.float64)
    a, r, b = connection.weights(streams)  # the same at every position with static weights only
    a, r, b = a.double().expand(T, B, n), r.double().expand(T, B, n, n), b.double().expand(T, B, n)
    for t in range(T):
        for s in range(B):
            h = sum(a[t, s, i] * streams[t, s, i].double() for i in range(n))
            increment = block(h.float()).double() - h
            for j in range(n):
                out[t, s, j] = sum(r[t, s, i, j] * streams[t, s, i].double() for i in range(n)) + b[t, s, j] * increment
    return out


@pytest.mark.parametrize("cls", [HyperConnections, ManifoldHyperConnections])
@pytest.mark.parametrize("dynamic", [False, True])
def test_a_block_matches_the_papers_loop(cls, dynamic):
    torch.manual_seed(0)
    connection = cls(8, 3, home=1, dynamic=dynamic)
    perturb(connection)
    if cls is ManifoldHyperConnections:
        with torch.no_grad():
            connection.gate.fill_(0.7)
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    streams = torch.randn(4, 2, 3, 8)
    weights = connection.weights(streams)
    h = connection.read(streams, weights)
    y = h + block(h)  # a pre-norm block: its input plus its sublayers
    got, _ = connection.write(streams, weights[1:], h, y, torch.ones(3))
    torch.testing.assert_close(got.double(), loop_reference(connection, streams, lambda x: x + block(x)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_mhc_weights_are_the_papers_constraints_and_the_gate_interpolates_from_the_identity(shared):
    """The gate blends H_pre from the block's own stream; in a checkpoint of the start before (``shared``) also H_res
    from I and H_post from 1, each staying doubly stochastic and non-negative."""
    torch.manual_seed(1)
    connection = ManifoldHyperConnections(8, 4, home=2)
    connection.gate_shared = shared
    perturb(connection)
    streams = torch.randn(3, 2, 4, 8)
    pre, post, res = connection.constrained(streams)
    assert (pre > 0).all() and (pre < 1).all() and (post > 0).all() and (post < 2).all()
    # r[i, j]: stream i into stream j; each new stream's weights sum to 1, each old stream's nearly
    torch.testing.assert_close(res.sum(-2), torch.ones(3, 2, 4), rtol=0, atol=1e-5)
    torch.testing.assert_close(res.sum(-1), torch.ones(3, 2, 4), rtol=0, atol=1e-2)
    closed = (torch.eye(4), torch.ones(4)) if shared else (res, post)
    for gate, expected in ((0.0, (connection.home, *closed)), (1.0, (pre, res, post))):
        with torch.no_grad():
            connection.gate.fill_(gate)
        for got, want in zip(connection.weights(streams), expected):
            torch.testing.assert_close(got, want.expand_as(got), rtol=0, atol=1e-6)
    with torch.no_grad():
        connection.gate.fill_(0.4)
    mix = connection.weights(streams)[1]
    assert (mix >= 0).all()
    torch.testing.assert_close(mix.sum(-2), torch.ones(3, 2, 4), rtol=0, atol=1e-5)  # still doubly stochastic


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_mhcs_start_saturates_no_weight(n):
    """Sinkhorn's H_res 1/2 on the diagonal and 1/(2(n - 1)) elsewhere (its logits' gradient S (1 - S) at its
    largest there), H_post = 2 sigmoid(0) = 1 exactly, sigmoid(b_pre) 1/2 on the own stream and summing to 1; the
    read the own stream (gate 0)."""
    connection = ManifoldHyperConnections(8, n, home=n - 1)
    streams = torch.randn(2, 3, n, 8)
    pre, post, res = connection.constrained(streams)
    start = torch.eye(n) * (0.5 - 1.0 / (2 * (n - 1))) + 1.0 / (2 * (n - 1)) if n > 1 else torch.ones(1, 1)
    torch.testing.assert_close(res, start.expand_as(res), rtol=0, atol=1e-6)
    assert torch.equal(post, torch.ones_like(post))
    torch.testing.assert_close(pre[..., n - 1], torch.full((2, 3), 0.5))
    if n > 1:
        torch.testing.assert_close(pre.sum(-1), torch.ones(2, 3), rtol=0, atol=1e-6)
    read = connection.weights(streams)[0]
    assert torch.equal(read, torch.nn.functional.one_hot(torch.tensor(n - 1), n).float().expand_as(read))


def test_mhcs_h_res_is_applied_a_permutation_permutes_the_streams():
    """Logits far apart on a permutation give Sinkhorn that permutation: each new stream is the old stream the
    permutation sends into it plus its share of the block's increment (no H_res computed and left unapplied)."""
    connection = ManifoldHyperConnections(8, 4, home=0, dynamic=False)
    order = torch.tensor([2, 0, 3, 1])  # new stream j takes old stream order[j]
    with torch.no_grad():
        connection.res_logits.copy_(40.0 * torch.nn.functional.one_hot(order, 4).float() - 20.0)
    streams = torch.randn(3, 2, 4, 8)
    weights = connection.weights(streams)
    h = connection.read(streams, weights)
    y = h + torch.randn(3, 2, 8)
    written, _ = connection.write(streams, weights[1:], h, y, torch.ones(4))
    torch.testing.assert_close(written, streams[:, :, order] + (y - h).unsqueeze(2), rtol=0, atol=1e-5)


def test_changing_mhcs_h_res_changes_the_model_once_the_streams_differ():
    """At the start the streams are copies, so no doubly stochastic H_res changes the model (the start is the
    Transformer whatever H_res is); once H_post writes the streams differently, H_res changes the output."""
    model, dictionary = build_tiny_model("transformer_mhc_base", ["--residual-streams", "3"])
    connections = [*model.encoder.dense_connections.connections, *model.decoder.dense_connections.connections]
    before = fixed_batch_logits(model, dictionary)
    with torch.no_grad():
        for connection in connections:
            connection.res_logits.add_(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))
    torch.testing.assert_close(fixed_batch_logits(model, dictionary), before, rtol=0, atol=2e-6)
    with torch.no_grad():
        for connection in connections:
            connection.post_logits.copy_(torch.tensor([1.0, -1.0, 0.5]))
    written_apart = fixed_batch_logits(model, dictionary)
    with torch.no_grad():
        for connection in connections[1:]:
            connection.res_logits.copy_(4.0 * torch.eye(3))
    assert (fixed_batch_logits(model, dictionary) - written_apart).abs().max() > 1e-3


def test_mhcs_mixing_learns_from_its_start_as_hyper_connections_do():
    """A few Adam steps on a toy task (benchmarks/stream_learning.py: reverse random tokens): every block past the
    first of each side (whose H_res only ever mixes copies) moves its mean H_res as hyper-connections' does, its
    logits take gradients (the start before: 1e-11, Sinkhorn saturated at the identity), phi of the order of
    hyper-connections' projections."""
    results = {family: stream_learning.train(family, 30, 1e-2, 5, 1, shape="base", extra=TINY_SHAPE)
               for family in ("hc", "mhc")}
    hc, mhc = results["hc"]["blocks"], results["mhc"]["blocks"]
    learning = [k for k in range(len(mhc)) if k not in (0, len(mhc) // 2)]
    for k in learning:
        assert mhc[k]["moved"] > 0.1 * min(block["moved"] for block in hc), k
        assert mhc[k]["mean_gradient_norms"]["res_logits"] > 1e-6, k
        assert mhc[k]["mean_gradient_norms"]["phi.weight"] > 0.01 * hc[k]["mean_gradient_norms"][
            "dynamic_read_mix.weight"], k


@pytest.mark.parametrize("start", [0.0, -0.5])
def test_the_gate_learns_from_its_start_and_from_below_its_clamp(start):
    """H_pre's gate, once the streams differ."""
    connection = ManifoldHyperConnections(8, 2, home=0)
    perturb(connection, seed=3)
    with torch.no_grad():
        connection.gate.fill_(start)
    streams = torch.randn(3, 2, 2, 8)
    weights = connection.weights(streams)
    h = connection.read(streams, weights)
    connection.write(streams, weights[1:], h, 2.0 * h + 1.0, torch.ones(2))[0].pow(2).sum().backward()
    assert connection.gate.grad is not None and connection.gate.grad.abs() > 0


def sinkhorn_reference(logits: torch.Tensor, iterations: int) -> torch.Tensor:
    """Sinkhorn-Knopp on one matrix in float64: alternately divide each column, then each row, by its sum
    (built anew at each step, so autograd differentiates it)."""
    m = logits.double().exp()
    for _ in range(iterations):
        m = torch.stack([m[:, j] / m[:, j].sum() for j in range(m.shape[1])], dim=1)
        m = torch.stack([m[i] / m[i].sum() for i in range(m.shape[0])], dim=0)
    return m


@pytest.mark.parametrize("iterations", [1, 3, 20])
def test_sinkhorn_matches_the_slow_reference(iterations):
    logits = 3 * torch.randn(2, 5, 4, 4, generator=torch.Generator().manual_seed(iterations))
    got = sinkhorn(logits, iterations)
    # contiguous like its input: a strided H_res sends the mix's batched matrix product down a per-matrix copy path
    assert got.shape == logits.shape and got.is_contiguous()
    for index in range(2):
        for k in range(5):
            torch.testing.assert_close(got[index, k].double(), sinkhorn_reference(logits[index, k], iterations),
                                       rtol=1e-5, atol=1e-6)


def test_sinkhorns_gradient_matches_the_slow_reference():
    """The gradient through the 20 iterations (as mHC trains its H_res logits), for a batch of positions."""
    logits = (3 * torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(0))).requires_grad_()
    weights = torch.randn(3, 2, 4, 4, generator=torch.Generator().manual_seed(1))
    (sinkhorn(logits) * weights).sum().backward()
    for index in range(3):
        for k in range(2):
            one = logits[index, k].detach().double().requires_grad_()
            (sinkhorn_reference(one, 20) * weights[index, k].double()).sum().backward()
            torch.testing.assert_close(logits.grad[index, k].double(), one.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sinkhorn_and_the_stream_weights_run_in_fp32_under_half_precision(dtype):
    logits = (10 * torch.randn(3, 4, 4)).to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        doubly = sinkhorn(logits)
    assert doubly.dtype == torch.float32 and torch.isfinite(doubly).all()
    torch.testing.assert_close(doubly.sum(-1), torch.ones(3, 4), rtol=0, atol=1e-5)
    for cls in (HyperConnections, ManifoldHyperConnections):
        connection = cls(8, 4).to(dtype)
        weights = connection.weights(torch.randn(2, 2, 4, 8).to(dtype) * 100)
        assert all(w.dtype == torch.float32 and torch.isfinite(w).all() for w in weights)


def adam_config(weight_decay: float):
    """fairseq's Adam configuration as fairseq-train hands it to ``optim.build_optimizer``."""
    cfg = OmegaConf.structured(FairseqAdamConfig(lr=[1e-3], weight_decay=weight_decay, tpu=False))
    with open_dict(cfg):
        cfg._name = "adam"
    return cfg


@pytest.mark.parametrize("family", FAMILIES)
def test_static_weights_get_no_weight_decay(family):
    model, _ = build_tiny_model(f"transformer_{family}_small", ["--residual-streams", "2"])
    params = list(model.parameters())
    built = optim.build_optimizer(adam_config(0.1), params)
    groups = built.optimizer.param_groups
    exempt = [p for p in params if getattr(p, "no_weight_decay", False)]
    assert len(groups) == 2 and groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == 0.1
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in exempt} and exempt
    assert not {id(p) for p in groups[0]["params"]} & {id(p) for p in exempt}
    before = {id(p): p.detach().clone() for p in params}
    for p in params:
        p.grad = torch.zeros_like(p)
    built.optimizer.step()  # no gradient: only weight decay moves a weight
    assert all(torch.equal(p, before[id(p)]) for p in exempt)
    decayed = [p for p in groups[0]["params"] if p.abs().sum() > 0]
    assert decayed and all(not torch.equal(p, before[id(p)]) for p in decayed)
    plain = optim.build_optimizer(adam_config(0.0), params)
    assert len(plain.optimizer.param_groups) == 1 and exempt_from_weight_decay(plain.optimizer) == 0


def test_the_readout_of_the_last_block_is_the_stacks_output():
    connections = build_dense_connections("hyper-connections", 8, 3, {"residual_streams": 2})
    assert [c.num_streams for c in connections] == [2, 2, 2]
    streams = torch.randn(3, 2, 2, 8)
    mix, write = torch.eye(2), torch.ones(2)
    h = torch.randn(3, 2, 8)
    written, state = connections[-1].write(streams, (mix, write), h, h + 1.0, connections[-1].readout)
    torch.testing.assert_close(state, written[:, :, 0])  # one-hot on stream 0


@pytest.mark.parametrize("flags,message", [
    (["--residual-streams", "0"], "--residual-streams: got 0; it must be an integer >= 1"),
    (["--stream-weights", "both"], "invalid choice: 'both'"),
])
def test_bad_stream_settings_are_one_clear_line(flags, message):
    with pytest.raises((AggregationConfigError, SystemExit)) as error:
        build_tiny_model("transformer_hc_small", flags)
    assert error.type is SystemExit or message in str(error.value)


def test_residual_streams_refuse_a_post_norm_side_and_the_output_placement():
    with pytest.raises(AggregationConfigError, match=r"--encoder-dense-connections hyper-connections: its residual "
                                                     r"streams replace the residual connections of pre-norm blocks; "
                                                     r"add --encoder-normalize-before"):
        build_tiny_model("transformer_linagg_base", ["--encoder-aggregation", "none", "--decoder-aggregation", "none",
                                                     "--encoder-dense-connections", "hyper-connections"])
    with pytest.raises(SystemExit):  # the parser: they run between blocks only
        parse_model_args("transformer_linagg_small", ["--encoder-aggregation", "mhc"])


def test_half_precision_weight_decay_that_cannot_exempt_the_static_weights_is_refused():
    adam = ["--optimizer", "adam", "--weight-decay", "0.01"]
    args = parse_model_args("transformer_mhc_small", ["--fp16", *adam])
    with pytest.raises(AggregationConfigError, match=r"--weight-decay 0.01 with --encoder-dense-connections mhc and "
                                                     r"--fp16/--bf16: .* use --amp, or --weight-decay 0"):
        AggregationPlan.from_args(args)
    AggregationPlan.from_args(parse_model_args("transformer_mhc_small", ["--amp", *adam]))
    AggregationPlan.from_args(parse_model_args("transformer_mhc_small", ["--fp16"]))


def test_the_streams_hold_n_times_the_residual_stream():
    model, dictionary = build_tiny_model("transformer_hc_small", ["--residual-streams", "3"])
    seen = []
    hook = model.encoder.layers[1].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(model.encoder.dense_connections.streams.shape), with_kwargs=True)
    src = random_tokens(dictionary, [5, 2], seed=1)
    with torch.no_grad():
        model.encoder(src, src_lengths=src.ne(1).sum(1))
    hook.remove()
    assert seen == [torch.Size([5, 2, 3, 16])]  # (T, B, n, C): n times the residual stream


def test_the_architectures_place_the_streams_between_blocks():
    plan = AggregationPlan.from_args(parse_model_args("transformer_hc_small"))
    assert plan.encoder.dense.cls is HyperConnections and plan.encoder.output is None
    assert plan.decoder.dense.settings.residual_streams == 4 and plan.decoder.dense.settings.stream_weights == "dynamic"


@pytest.mark.parametrize("family", FAMILIES)
def test_an_encoder_with_streams_matches_a_loop_over_its_blocks(family):
    """Block l reads its input from the streams and writes its output back; the readout after the top block,
    normalised, is the encoder's output."""
    model, dictionary = build_tiny_model(f"transformer_{family}_base", ["--residual-streams", "3"])
    encoder = model.encoder
    perturb(encoder.dense_connections, seed=4)
    if family == "mhc":
        with torch.no_grad():
            for connection in encoder.dense_connections.connections:
                connection.gate.fill_(0.6)
    got, x, padding_mask = encoder_and_embedding(encoder, dictionary)
    with torch.no_grad():
        streams = torch.stack([x] * 3, dim=2)
        for layer, connection in zip(encoder.layers, encoder.dense_connections.connections):
            a, r, b = connection.weights(streams)
            h = torch.einsum("tbn,tbnc->tbc", a, streams)
            increment = reference_block(layer, [h] * 4, padding_mask) - h
            streams = torch.einsum("tbij,tbic->tbjc", r, streams) + b.unsqueeze(-1) * increment.unsqueeze(2)
        expected = encoder.layer_norm(torch.einsum("n,tbnc->tbc", connection.readout, streams))
    real = ~padding_mask.t()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)
