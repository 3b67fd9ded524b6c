"""The fused operators' one setting, and where they find their Triton kernels: on CUDA tensors, where Triton is
installed."""

import functools
import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

from torch import Tensor

from .settings import Settings, setting

#: The implementations of ``--connection-kernels``: the fused operators, or the eager references.
KERNELS = ("fused", "eager")


@dataclass
class KernelSettings(Settings):
    """The setting of every family with fused operators."""

    connection_kernels: str = setting(
        "fused", "routing, depth attention, MUDD, hyper-connections, mHC: the routing iterations and each "
                 "connection's weights, read and write as a few fused operators each way (fused: a Triton kernel "
                 "each on CUDA, the eager reference inside the operator elsewhere) or as the eager references "
                 "(eager: tens of kernels a connection); the same values", choices=KERNELS)


@functools.cache
def _module(name: str) -> Optional[ModuleType]:
    if importlib.util.find_spec("triton") is None:
        return None
    return importlib.import_module(f"{__package__}.{name}")


def triton_kernels(name: str, tensor: Tensor) -> Optional[ModuleType]:
    """This package's module ``name`` of Triton kernels for ``tensor``: None on a CPU (the operator runs its eager
    reference) or without Triton."""
    return _module(name) if tensor.is_cuda else None
