"""Where the fused operators run and find their Triton kernels: on CUDA tensors, where Triton is installed (and on
CPU tensors in Triton's interpreter, within :func:`kernels_on_cpu`), each operator's kernels in its namesake under
:mod:`..kernels`; a kernel that fails there stops with :class:`KernelFailed`. ``--connection-kernels``
(:class:`..settings.KernelSettings`) picks the implementation."""

import contextlib
import functools
import importlib
import importlib.util
import os
from types import ModuleType
from typing import Callable, Iterator, List, Optional

import torch
from torch import Tensor

@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _kernels_of(operator: str) -> Optional[ModuleType]:
    """The module of Triton kernels of the operator module ``operator`` (``...ops.em_route``): its namesake in
    :mod:`..kernels` (``...kernels.em_route``), imported where Triton is installed; None elsewhere."""
    package, _, name = operator.rpartition(".ops.")
    return importlib.import_module(f"{package}.kernels.{name}") if _triton_installed() else None


def runs_fused(kernel: str, tensor: Tensor) -> bool:
    """Whether ``--connection-kernels`` ``kernel`` runs the fused operator on ``tensor``: with ``fused`` always,
    with ``eager`` never, with ``auto`` where its Triton kernel runs (a CUDA tensor, Triton installed): on a CPU
    the eager references are faster than the operators, which run them inside and their backward written out."""
    return kernel == "fused" or (kernel == "auto" and tensor.is_cuda and _triton_installed())


#: Whether the operators launch their kernels on CPU tensors (:func:`kernels_on_cpu`), innermost last.
_on_cpu: List[bool] = [False]


@contextlib.contextmanager
def kernels_on_cpu() -> Iterator[None]:
    """Within it the fused operators launch their Triton kernels on CPU tensors too, where Triton's interpreter runs
    them, so that a CPU runs the launchers a GPU runs (the tests; ``benchmarks/compiled_kernels.py``, which collects
    the kernel variants a model launches).

    Raises:
        RuntimeError: the interpreter is off (``TRITON_INTERPRET=1`` must be set before Triton is imported).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("kernels_on_cpu needs Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    _on_cpu.append(True)
    try:
        yield
    finally:
        _on_cpu.pop()


class KernelFailed(RuntimeError):
    """A fused operator's Triton kernel did not compile or run on this device."""


def _device_description(device: torch.device) -> str:
    """The device as a kernel failure names it: the GPU's name and architecture, and Triton's version."""
    import triton  # only here where Triton is installed (_kernels_of found it)

    if device.type != "cuda":
        return f"{device} (Triton {triton.__version__}, interpreter)"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor}, Triton {triton.__version__})"


class Launchers:
    """A module of Triton kernels whose launchers (``forward``, ``backward``, ...) raise :class:`KernelFailed` naming
    the launcher, the device and the way round when Triton fails to compile or run a kernel: never a silent fallback
    to the reference."""

    def __init__(self, module: ModuleType, device: torch.device):
        self._module, self._device = module, device

    def __getattr__(self, launcher: str) -> Callable:
        run = getattr(self._module, launcher)
        name = f"kernels.{self._module.__name__.rsplit('.', 1)[-1]}.{launcher}"

        @functools.wraps(run)
        def launch(*args, **kwargs):
            from triton import TritonError

            try:
                return run(*args, **kwargs)
            except (TritonError, RuntimeError) as error:
                if isinstance(error, (torch.OutOfMemoryError, KernelFailed)):
                    raise
                raise KernelFailed(f"the Triton kernel {name} failed on {_device_description(self._device)}: "
                                   f"{type(error).__name__}: {error}; train or decode with --connection-kernels eager "
                                   "to use the eager references instead") from error

        return launch


def triton_kernels(operator: str, tensor: Tensor) -> Optional[Launchers]:
    """The launchers of the Triton kernels of the operator module ``operator`` (its ``__name__``: the kernels are its
    namesake under :mod:`..kernels`) for ``tensor``: None on a CPU (the operator runs its eager reference; but
    within :func:`kernels_on_cpu`) or without Triton."""
    if not (tensor.is_cuda or (_on_cpu[-1] and tensor.device.type == "cpu")):
        return None
    module = _kernels_of(operator)
    return None if module is None else Launchers(module, tensor.device)
