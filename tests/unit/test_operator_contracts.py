"""Every fused operator (``capsagg::*``) computes what its fake says it will: the shapes, dtypes and strides that
autograd and torch.compile plan with, checked by ``torch.library.opcheck`` on every call one training step of each
family makes, in fp32 and in a model cast to bf16 (fairseq's ``--bf16``); on a CPU (the references inside the
operators) and, where there is one, on CUDA (the Triton kernels)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import build_tiny_model, random_tokens

#: The families whose connections run fused operators, and the operators each must call forward and backward.
OPERATORS = {
    "depthattn": {"depth_softmax"},
    "mudd": {"mudd_aggregate"},
    "hc": {"hyper_read", "stream_write"},
    "mhc": {"mhc_read", "mhc_mix", "stream_write"},
    "emrouting": {"em_route"},
    "dynrouting": {"dynamic_route"},
}


class OperatorCalls(TorchDispatchMode):
    """Records every ``capsagg::`` operator called while active, with its arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "capsagg":
            self.calls.append((func, args, kwargs or {}))
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
        torch.library.opcheck(func, args, kwargs, test_utils=("test_schema", "test_faketensor"))
