"""Whole models through the Triton launchers a GPU runs, on the CPU: every fused family's model with its operators
launching their Triton kernels in the interpreter (:func:`~fairseq_capsagg.aggregators.ops.dispatch.kernels_on_cpu`; the
registered operators' own checks, aliasing among them, run on every call) against ``--connection-kernels eager``,
in fp32 and in bf16: one training step's logits and every gradient, and incremental decoding against the full
forward. At shapes the kernel tests do not use: a model width that is not a power of two (24), 3 residual
streams, capsules of width 3, a ragged batch with a one-token sentence."""

from typing import Dict

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="on a GPU the launchers run natively: tests/unit/test_cuda.py")

from compiled_kernels import recorded_launches  # noqa: E402  (benchmarks/, on the path from tests/conftest.py)

from fairseq_capsagg.aggregators.ops.dispatch import kernels_on_cpu  # noqa: E402
from fairseq_capsagg.models.build import build_model, model_args  # noqa: E402
from helpers import random_tokens, tiny_dictionary  # noqa: E402

FAMILIES = ("dynrouting", "emrouting", "depthattn", "mudd", "hc", "mhc")
#: d 24 (not a power of two), 3 heads of 8, 2 + 2 layers, 3 streams, 8 output capsules of width 3.
SHAPE = ["--encoder-embed-dim", "24", "--decoder-embed-dim", "24", "--encoder-ffn-embed-dim", "40",
         "--decoder-ffn-embed-dim", "40", "--encoder-attention-heads", "3", "--decoder-attention-heads", "3",
         "--encoder-layers", "2", "--decoder-layers", "2", "--residual-streams", "3", "--output-capsules", "8",
         "--dropout", "0"]
#: A ragged batch: a sentence of one token (its EOS) beside one of six.
SOURCE_LENGTHS, TARGET_LENGTHS = [6, 1], [4, 4]


def models(family: str, dtype: torch.dtype):
    """The eager and the launching model of ``family`` in ``dtype``, equal weights moved away from their identity
    start, and the eager model in fp32 with the same (``dtype``-rounded) weights: the exact values."""
    dictionary = tiny_dictionary()
    built = {}
    for kernels in ("eager", "fused", "exact"):
        torch.manual_seed(0)
        args = model_args(f"transformer_{family}_base", [*SHAPE, "--connection-kernels", kernels.replace("exact",
                                                                                                         "eager")])
        built[kernels] = build_model(args, dictionary)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in built["eager"].named_parameters():
            if ".dense_connections." in name or ".aggregator." in name:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    built["eager"].to(dtype)
    for other in ("fused", "exact"):
        built[other].load_state_dict(built["eager"].state_dict())
    return built["eager"].eval(), built["fused"].to(dtype).eval(), built["exact"].eval(), dictionary


def error(got: torch.Tensor, exact: torch.Tensor, scale: float) -> float:
    """The distance of ``got`` from ``exact`` over ``exact``'s norm, floored at 1% of ``scale`` per element (a
    gradient that is zero but for rounding, as the keys' biases', has no scale of its own)."""
    floor = 1e-2 * scale * exact.numel() ** 0.5
    return ((got.float() - exact).norm() / max(exact.norm().item(), floor)).item()


def assert_as_close(fused: Dict[str, torch.Tensor], eager: Dict[str, torch.Tensor], exact: Dict[str, torch.Tensor],
                    dtype: torch.dtype) -> None:
    """fp32: the launchers' values are the eager model's but for rounding, element by element (the kernels sum in
    another order; a wrong kernel is off by its whole scale). bf16: the launchers' values are within 12% of the fp32
    model's (or three times the eager bf16 model's distance from them, where that is larger): Triton's interpreter
    rounds what it stores in bf16 toward zero (a GPU to the nearest), so the kernels' roundings add up with one sign
    here, two to six times the eager path's; a wrong kernel is off by its whole scale."""
    assert fused.keys() == eager.keys() == exact.keys()
    scale = max(t.abs().max().item() for t in exact.values())
    for name, want in exact.items():
        if dtype == torch.float32:
            torch.testing.assert_close(fused[name], eager[name], rtol=5e-3, atol=5e-3 * 1e-2 * scale, msg=name)
        else:
            limit = max(3 * error(eager[name], want, scale), 0.12)
            assert error(fused[name], want, scale) <= limit, (
                f"{name}: the launchers are {error(fused[name], want, scale):.3g} from fp32, eager bf16 "
                f"{error(eager[name], want, scale):.3g}")


def batch(dictionary):
    src = random_tokens(dictionary, SOURCE_LENGTHS, seed=3)
    prev = random_tokens(dictionary, TARGET_LENGTHS, seed=4, bos=True)
    return src, src.ne(dictionary.pad()).sum(1), prev


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_training_step_through_the_launchers_computes_the_eager_models_logits_and_gradients(family, dtype):
    eager, fused, exact, dictionary = models(family, dtype)
    src, lengths, prev = batch(dictionary)
    logits, grads, launched = {}, {}, {}
    for name, model in (("eager", eager), ("fused", fused), ("exact", exact)):
        with kernels_on_cpu(), recorded_launches(launched, (family, "tiny", str(dtype), name), execute=True):
            out = model(src, lengths, prev)[0]  # no dropout, gradients on
            out.float().pow(2).mean().backward()
        logits[name] = {"logits": out.detach().float()}
        grads[name] = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    # the fused model ran its kernels each way, the eager ones none
    assert {v["origins"][0][3] for v in launched.values()} == {"fused"}
    functions = {v["function"] for v in launched.values()}
    assert "_forward_kernel" in functions and {f.endswith("_backward_kernel") for f in functions} == {True, False}
    assert_as_close(logits["fused"], logits["eager"], logits["exact"], dtype)
    assert_as_close(grads["fused"], grads["eager"], grads["exact"], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decoding_through_the_launchers_equals_the_eager_full_forward(family, dtype):
    eager, fused, exact, dictionary = models(family, dtype)
    src, lengths, prev = batch(dictionary)
    with torch.no_grad():
        full = {name: {"logits": model(src, lengths, prev)[0].float()} for name, model in
                (("eager", eager), ("exact", exact))}
        with kernels_on_cpu():
            encoder_out = fused.encoder(src, src_lengths=lengths)
            state = {}
            steps = [fused.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)[0]
                     for t in range(prev.size(1))]
    assert_as_close({"logits": torch.cat(steps, 1).float()}, full["eager"], full["exact"], dtype)
