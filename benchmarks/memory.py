"""Peak memory of a training step, counted on any device: the CPU's proxy for a GPU's peak memory.

Every tensor an ATen operator (or a fused ``torch.library`` operator) returns is counted from its allocation
until its storage is freed, so the peak is the most memory the step's tensors held at once: the activations
autograd saves for the backward and the backward's own tensors. Memory held before the step (parameters,
inputs) is not counted; an operator's scratch memory inside it is not either. On a GPU,
``torch.cuda.max_memory_allocated`` measures the same plus the parameters and the optimizer's state.
"""

import weakref
from typing import Set

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fairseq_capsagg.aggregators.base import gpu_checks_only
from kernels import training_step


class PeakMemory(TorchDispatchMode):
    """The bytes of the storages that operators allocated while it was active and that are still alive, and
    their peak."""

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: Set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._track(tensor.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key in self._tracked or storage.nbytes() == 0:
            return
        self._tracked.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, storage.nbytes())

    def _free(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes


def training_step_peak_memory(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                              prev: torch.Tensor, target: torch.Tensor) -> int:
    """The peak bytes of one forward and backward pass (after one unmeasured pass, which builds what is built
    once); the gradients of the parameters count from their allocation."""
    step = training_step(model, src, lengths, prev, target)
    with gpu_checks_only():
        step()
        model.zero_grad(set_to_none=True)
        with PeakMemory() as memory:
            step()
    return memory.peak
