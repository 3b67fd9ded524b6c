"""Where the fused operators find their Triton kernels: on CUDA tensors, where Triton is installed."""

import functools
import importlib
import importlib.util
from types import ModuleType
from typing import Optional

from torch import Tensor

#: The implementations of ``--stream-kernels``: the fused operators, or the eager references.
KERNELS = ("fused", "eager")


@functools.cache
def _module(name: str) -> Optional[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(f"{__package__}.{name}")


def triton_kernels(name: str, tensor: Tensor) -> Optional[ModuleType]:
    """This package's module ``name`` of Triton kernels for ``tensor``: None on a CPU (the operator runs its eager
    reference) or without Triton."""
    return _module(name) if tensor.is_cuda else None
