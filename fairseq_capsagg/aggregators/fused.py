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

#: The implementations of ``--connection-kernels``: the fused operators where their Triton kernels run (auto), the
#: fused operators everywhere (on a CPU: the references inside one operator each way), or the eager references.
KERNELS = ("auto", "fused", "eager")


@dataclass
class KernelSettings(Settings):
    """The setting of every family with fused operators."""

    connection_kernels: str = setting(
        "auto", "routing, depth attention, MUDD, hyper-connections, mHC: the routing iterations and each "
                 "connection's weights, read and write as a few fused operators each way, a Triton kernel each "
                 "(auto: on CUDA with Triton, the eager references elsewhere; fused: everywhere, on a CPU the "
                 "references inside the operators) or as the eager references (eager: tens of kernels a "
                 "connection); the same values", choices=KERNELS)


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _module(name: str) -> Optional[ModuleType]:
    return importlib.import_module(f"{__package__}.{name}") if _triton_installed() else None


def runs_fused(kernel: str, tensor: Tensor) -> bool:
    """Whether ``--connection-kernels`` ``kernel`` runs the fused operator on ``tensor``: with ``fused`` always,
    with ``eager`` never, with ``auto`` where its Triton kernel runs (a CUDA tensor, Triton installed): on a CPU
    the eager references are faster than the operators, which run them inside and their backward written out."""
    return kernel == "fused" or (kernel == "auto" and tensor.is_cuda and _triton_installed())


def triton_kernels(name: str, tensor: Tensor) -> Optional[ModuleType]:
    """This package's module ``name`` of Triton kernels for ``tensor``: None on a CPU (the operator runs its eager
    reference) or without Triton."""
    return _module(name) if tensor.is_cuda else None


def warps(tile: int) -> int:
    """Warps for a program that holds ``tile`` values of one position at once (the routing kernels), as the Triton
    tutorials' row softmax: more warps for wider tiles, so that fewer registers spill."""
    return 16 if tile >= 4096 else 8 if tile >= 2048 else 4
