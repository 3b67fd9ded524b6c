"""Every fused operator (``capsagg::*``) computes what its fake says it will: the shapes, dtypes and strides that
autograd and torch.compile plan with, its declared mutations, its autograd registration and, for the forward
operators, a trace of forward and backward as torch.compile makes it (dynamic shapes). Checked by
``torch.library.opcheck`` on every call one training step of each family makes, in fp32 and in a model cast to bf16
(fairseq's ``--bf16``); on a CPU (the references inside the operators) and, where there is one, on CUDA (the Triton
kernels)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from helpers import build_tiny_model, random_tokens

#: The families whose connections run fused operators, and the operators each must call forward and backward.
OPERATORS = {
    "depthattn": {"depth_softmax"},
    "mudd": {"mudd_aggregate"},
    "hc": {"hyper_read", "hyper_write_read", "stream_write"},
    "mhc": {"mhc_read", "mhc_mix", "mhc_write_read", "stream_write"},
    "emrouting": {"em_route", "input_activation"},
    "dynrouting": {"dynamic_route"},
}


def _detached(value):
    """A copy of an argument out of the model's graph, as it was when called, still requiring grad where it did."""
    if not isinstance(value, torch.Tensor):
        return value
    return value.detach().clone().requires_grad_(value.requires_grad)


def _signature(func, args) -> tuple:
    """An operator and its arguments' shapes, dtypes and values: the blocks of a stack call each operator alike."""
    return (func, *((tuple(a.shape), a.dtype, a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args))


class OperatorCalls(TorchDispatchMode):
    """Records each kind of ``capsagg::`` operator call made while active, with a copy of its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "capsagg" and _signature(func, args) not in self.seen:  # each kind of call once
            self.seen.add(_signature(func, args))
            self.calls.append((func, tree_map(_detached, args), tree_map(_detached, kwargs or {})))
        return func(*args, **(kwargs or {}))


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", sorted(OPERATORS))
def test_every_fused_operator_computes_what_its_fake_promises(family, dtype, device):
    model, dictionary = build_tiny_model(f"transformer_{family}_base", ["--connection-kernels", "fused"])
    model = model.to(device, dtype).train()
    src = random_tokens(dictionary, [6, 3], seed=1).to(device)
    prev = random_tokens(dictionary, [5, 5], seed=2, bos=True).to(device)
    with OperatorCalls() as recorder:
        logits = model(src, src.ne(dictionary.pad()).sum(1), prev)[0]
        logits.float().sum().backward()
    called = {func.__name__.split(".")[0] for func, _, _ in recorder.calls}
    assert called >= OPERATORS[family] | {f"{name}_backward" for name in OPERATORS[family]}
    for func, args, kwargs in recorder.calls:
        # a forward operator also traced forward and backward as torch.compile does (the backward operators are
        # differentiated once only)
        traced = () if func.__name__.split(".")[0].endswith("_backward") else ("test_aot_dispatch_dynamic",)
        torch.library.opcheck(func, args, kwargs,
                              test_utils=("test_schema", "test_faketensor", "test_autograd_registration", *traced))
