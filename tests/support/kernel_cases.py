"""What the kernel tests (tests/unit/kernels/) share: where the kernels run, the tolerance of their sums against
the eager references', and the context in which the operators launch them."""

import contextlib

import torch

from fairseq_capsagg.aggregators.ops.dispatch import kernels_on_cpu

#: The kernels and the loop both sum in fp32, in another order.
TOLERANCE = dict(rtol=1e-5, atol=1e-6)

#: Where the kernels run: the GPU, or the interpreter's CPU tensors (tests/conftest.py sets ``TRITON_INTERPRET=1``).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def launching():
    """Where the operators launch their kernels on ``DEVICE``'s tensors: on CUDA always, on the CPU in the
    interpreter."""
    return contextlib.nullcontext() if DEVICE == "cuda" else kernels_on_cpu()
