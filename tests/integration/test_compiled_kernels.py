"""Every Triton kernel variant the fused families' models launch compiles for real GPUs, without one: collected by
running each family's model (``small`` and ``base``, fp32 and bf16, a training step and incremental decoding) with
its launchers recorded as Triton's JIT would specialise them, then compiled with ``triton.compile`` for sm_80
(Ampere) and sm_90 (Hopper) by the installed Triton (``benchmarks/compiled_kernels.py``; ``make compile-check``
runs it against another Triton). Triton's interpreter runs code its compiler rejects, so the kernel tests alone
cannot say this."""

import importlib
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="collects its variants in Triton's interpreter, off where a GPU is")

import compiled_kernels  # noqa: E402  (benchmarks/, on the path from tests/conftest.py)

import fairseq_capsagg.aggregators.kernels  # noqa: E402

#: The targets every variant is compiled for here (the published table adds sm_89, sm_100 and sm_120).
TARGETS = (80, 90)
SUPPORT = Path(__file__).resolve().parents[1] / "support"


def defined_kernels():
    """Every kernel the package's Triton modules define to launch from Python (Triton functions named ``*_kernel``;
    the others are device functions)."""
    from triton.runtime import KernelInterface

    package = Path(fairseq_capsagg.aggregators.kernels.__file__).parent
    names = set()
    for path in package.glob("[!_]*.py"):
        module = importlib.import_module(f"fairseq_capsagg.aggregators.kernels.{path.stem}")
        names |= {f"{path.stem}.{name}" for name, value in vars(module).items()
                  if name.endswith("_kernel") and isinstance(value, KernelInterface)}
    return names


@pytest.fixture(scope="module")
def compiled():
    variants = compiled_kernels.collect_variants()
    return variants, compiled_kernels.compile_all(variants, TARGETS)


def test_the_models_launch_every_kernel_the_package_defines(compiled):
    variants, _ = compiled
    assert {v["kernel"] for v in variants} == defined_kernels()
    # both precisions, both passes and the position counts Triton specialises (1, a multiple of 16, neither)
    origins = {tuple(o) for v in variants for o in v["origins"]}
    assert {o[2] for o in origins} == {"fp32", "bf16"} and {o[3] for o in origins} == {"train", "decode"}


def test_every_variant_compiles_for_ampere_and_hopper(compiled):
    _, rows = compiled
    assert len(rows) == len(compiled[0]) * len(TARGETS)
    failed = [f"{r['kernel']} on {r['target']} ({r['variant']['origins'][0]}): {r['error'][:500]}"
              for r in rows if not r["compiled"]]
    assert not failed, "\n".join(failed)
    assert all(r["registers"] > 0 for r in rows)


def test_a_kernel_the_compiler_rejects_fails_the_check(monkeypatch):
    """The interpreter runs a kernel that reads a module global; the compiler refuses it, and so does the check."""
    monkeypatch.setenv("PYTHONPATH", str(SUPPORT))
    variant = {"kernel": "bad_kernels.global_scale_kernel", "module": "bad_kernels",
               "function": "global_scale_kernel", "signature": {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
               "constexprs": [[[2], 16]], "attrs": [], "options": {}}
    (row,) = compiled_kernels.compile_all([variant], [90], workers=1)
    assert not row["compiled"] and "_SCALE" in row["error"]
