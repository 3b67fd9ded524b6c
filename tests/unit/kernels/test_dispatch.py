"""Where the fused operators find their Triton kernels (``aggregators/ops/dispatch.py``): each operator's namesake under
``aggregators/kernels/`` on CUDA (and in the interpreter within ``kernels_on_cpu``), none elsewhere; a kernel that fails
names itself, the device and the way round."""

import os

import pytest
import torch

pytest.importorskip("triton")

from fairseq_capsagg.aggregators.kernels import sinkhorn as sinkhorn_triton  # noqa: E402
from fairseq_capsagg.aggregators.kernels import stream_write as stream_write_triton  # noqa: E402
from fairseq_capsagg.aggregators.ops import sinkhorn, stream_write  # noqa: E402
from fairseq_capsagg.aggregators.ops.dispatch import KernelFailed, triton_kernels  # noqa: E402
from fairseq_capsagg.aggregators.ops.sinkhorn import sinkhorn_reference  # noqa: E402
from kernel_cases import DEVICE, TOLERANCE, launching  # noqa: E402


def test_without_a_gpu_the_kernels_run_in_the_interpreter():
    assert torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def test_the_fused_operators_take_the_kernels_on_cuda_and_the_references_elsewhere():
    logits = torch.randn(3, 4, 4, device=DEVICE)
    assert (triton_kernels(sinkhorn.__name__, logits) is not None) == (DEVICE == "cuda")
    assert triton_kernels(stream_write.__name__, logits.cpu()) is None
    with launching():
        assert triton_kernels(stream_write.__name__, logits).forward.__wrapped__ is stream_write_triton.forward
    torch.testing.assert_close(torch.ops.capsagg.sinkhorn(logits, 5), sinkhorn_reference(logits, 5), **TOLERANCE)


def test_a_kernel_that_fails_names_itself_the_device_and_the_way_round(monkeypatch):
    from triton.runtime.errors import OutOfResources

    def out_of_shared_memory(*args):
        raise OutOfResources(262144, 232448, "shared memory")

    monkeypatch.setattr(sinkhorn_triton, "forward", out_of_shared_memory)
    with launching(), pytest.raises(KernelFailed) as failure:
        torch.ops.capsagg.sinkhorn(torch.randn(3, 4, 4, device=DEVICE), 5)
    message = str(failure.value)
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    assert "kernels.sinkhorn.forward" in message and device in message and "shared memory" in message
    assert "--connection-kernels eager" in message and isinstance(failure.value.__cause__, OutOfResources)


def test_running_out_of_memory_is_not_a_kernel_failure(monkeypatch):
    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(sinkhorn_triton, "forward", out_of_memory)
    with launching(), pytest.raises(torch.OutOfMemoryError):
        torch.ops.capsagg.sinkhorn(torch.randn(3, 4, 4, device=DEVICE), 5)
