"""Every family on CUDA (skipped without a GPU; examples/gpu_check.sh runs them where there is one): the GPU's
logits are the CPU's, the fused paths compute what the eager references do (values and gradients), a bf16
training step is finite, and incremental decoding equals the full forward."""

import pytest
import torch

from blocks import StackPerConnection
from fairseq_capsagg.aggregators import families
from fairseq_capsagg.models import dense_connections
from fairseq_capsagg.aggregators.layer_history import LayerHistory
from helpers import build_tiny_model, random_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ARCHS = {family: f"transformer_{family}_base" for family in families()}
#: The eager reference of each fused path, by family.
EAGER = {family: ["--connection-kernels", "eager"] for family in ("hc", "mhc", "depthattn", "mudd")}
#: fp32 on another device sums in another order; a wrong kernel differs by far more.
TOLERANCE = dict(rtol=1e-4, atol=2e-5)


def away_from_the_start(model, seed: int = 0):
    """Every aggregation weight moved, so that no path is the identity it starts as."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "aggregat" in name or "dense_connections" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model


def batch(dictionary, device):
    src = random_tokens(dictionary, [7, 4, 6], seed=5).to(device)
    prev = random_tokens(dictionary, [6, 6, 6], seed=6, bos=True).to(device)
    return src, src.ne(dictionary.pad()).sum(1), prev


@pytest.mark.parametrize("family", ARCHS)
def test_cuda_logits_and_gradients_are_the_cpus_and_the_eager_paths(family):
    cpu, dictionary = build_tiny_model(ARCHS[family])
    away_from_the_start(cpu)
    eager, _ = build_tiny_model(ARCHS[family], EAGER.get(family, []))
    eager.load_state_dict(cpu.state_dict())
    fast = build_tiny_model(ARCHS[family])[0]
    fast.load_state_dict(cpu.state_dict())
    results = {}
    for name, model, device in (("cpu", cpu, "cpu"), ("eager", eager.cuda(), "cuda"), ("fast", fast.cuda(), "cuda")):
        src, lengths, prev = batch(dictionary, device)
        logits = model.eval()(src, lengths, prev)[0]  # no dropout, gradients on
        logits.float().pow(2).mean().backward()
        results[name] = (logits.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters()
                                                 if p.grad is not None})
    for name in ("eager", "fast"):
        torch.testing.assert_close(results[name][0], results["cpu"][0], **TOLERANCE)
        for parameter, grad in results["cpu"][1].items():
            torch.testing.assert_close(results[name][1][parameter], grad, **TOLERANCE, msg=parameter)


@pytest.mark.parametrize("precision", ["autocast", "cast"])
@pytest.mark.parametrize("family", ARCHS)
def test_a_bf16_training_step_is_finite(family, precision):
    """Under autocast, and with the model cast to bf16 as fairseq's --bf16 trains it (the fused kernels then read
    bf16 weights)."""
    model, dictionary = build_tiny_model(ARCHS[family])
    model = away_from_the_start(model).cuda().train()
    if precision == "cast":
        model = model.to(torch.bfloat16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    src, lengths, prev = batch(dictionary, "cuda")
    for _ in range(2):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "autocast"):
            logits = model(src, lengths, prev)[0]
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), prev.flatten())
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
        assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("family", ARCHS)
def test_incremental_decoding_equals_the_full_forward_on_cuda(family):
    model, dictionary = build_tiny_model(ARCHS[family])
    model = away_from_the_start(model).cuda().eval()
    src, lengths, prev = batch(dictionary, "cuda")
    with torch.no_grad():
        full = model(src, lengths, prev)[0]
        encoder_out = model.encoder(src, src_lengths=lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            steps.append(model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, **TOLERANCE)


@pytest.mark.parametrize("family", ["dwa", "dlcl", "depthattn", "mudd"])
def test_connections_between_blocks_hold_each_layer_output_once_on_cuda(family, monkeypatch):
    """The CUDA allocator holds less after the forward with the layers in one buffer than with a stack per
    connection, and the logits are the same (tests/unit/test_layer_history.py counts how much less on the CPU)."""
    model, dictionary = build_tiny_model(ARCHS[family])
    model = model.cuda().train()
    src, lengths, prev = batch(dictionary, "cuda")
    held, logits = {}, {}
    for history_type in (StackPerConnection, LayerHistory):
        monkeypatch.setattr(dense_connections, "LayerHistory", history_type)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.manual_seed(1)  # the same dropout
        out = model(src, lengths, prev)[0]
        held[history_type] = torch.cuda.memory_allocated() - before
        out.float().pow(2).mean().backward()
        logits[history_type] = out.detach()
        del out
    assert held[LayerHistory] < held[StackPerConnection]
    assert torch.equal(logits[LayerHistory], logits[StackPerConnection])
