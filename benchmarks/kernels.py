"""Kernels launched per training step and per incremental decoding step: the CPU's proxy for a GPU's launches.

Every ATen operator a step dispatches launches one kernel on a GPU, but for those that only make a new view of
their input (``OpOverload.is_view``, and ``_unsafe_view``) or only allocate; where the arithmetic is small, as in
a `base` model in bf16, launches and their Python overhead bound the step's time. Counted with a
``TorchDispatchMode`` on any device, so a change that adds or removes launches shows without a GPU. A fused
operator (one ``torch.library`` custom op, a Triton kernel on CUDA) counts once. The training step runs under
:func:`~fairseq_capsagg.aggregators.base.gpu_checks_only`, so the CPU runs what a GPU runs.
"""

import collections
from typing import Callable, Counter, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fairseq_capsagg.aggregators.base import gpu_checks_only

#: Operators that are no view by their schema but launch no kernel either.
NO_KERNEL = frozenset({"aten::_unsafe_view", "aten::empty", "aten::empty_like", "aten::empty_strided",
                       "aten::new_empty", "aten::new_empty_strided", "aten::lift_fresh",
                       "aten::set_"})


#: Operators that fill their output without reading their tensor arguments (their shape, dtype and device only).
FILLS = frozenset({"aten::new_zeros", "aten::new_ones", "aten::new_full", "aten::zeros_like", "aten::ones_like",
                   "aten::full_like"})


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` launches a kernel on a GPU."""
    return not func.is_view and func.overloadpacket._qualified_op_name not in NO_KERNEL


def _distinct(tensors) -> Dict[tuple, torch.Tensor]:
    """The distinct tensors among ``tensors`` (any pytree), keyed by the memory each covers: its storage, offset,
    shape, strides and type."""
    return {(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype): t
            for t in tree_leaves(tensors) if isinstance(t, torch.Tensor)}


class KernelCounter(TorchDispatchMode):
    """Counts the kernel-launching operators dispatched while it is active, by name, and the bytes they move:
    every tensor an operator reads (its arguments, none for a fill) and writes (its outputs), an output that is one
    of its arguments (in place) counted once. A fused operator moves what it reads and writes once, whatever it
    computes inside; an ATen operator's own re-reads (a matrix product's tiles) are not counted."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = collections.Counter()
        self.bytes_moved = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if launches_kernel(func):
            self.counts[str(func.overloadpacket)] += 1
            read = () if func.overloadpacket._qualified_op_name in FILLS else (args, kwargs)
            moved = {**_distinct(out), **_distinct(read)}  # an output written in place is read too
            self.bytes_moved += sum(t.numel() * t.element_size() for t in moved.values())
        return out

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def training_step(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor, prev: torch.Tensor,
                  target: torch.Tensor) -> Callable[[], None]:
    """One forward and backward pass of ``model`` in training mode, in its precision, its gradients reset first;
    the loss in fp32."""
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        logits, _ = model(src, lengths, prev)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten()).backward()

    return step


def training_step_kernels(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                          prev: torch.Tensor, target: torch.Tensor) -> KernelCounter:
    """The kernels of one forward and backward pass (after one uncounted pass, which builds what is built
    once)."""
    step = training_step(model, src, lengths, prev, target)
    with gpu_checks_only():
        step()
        with KernelCounter() as counter:
            step()
    return counter


def decoding_step_kernels(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                          eos: int) -> KernelCounter:
    """The kernels of the decoder's second incremental step (the first fills its caches)."""
    model.eval()
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state: Dict[str, Dict[str, torch.Tensor]] = {}
        tokens = torch.full((src.size(0), 1), eos, device=src.device)
        model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
        tokens = torch.cat([tokens, src[:, :1]], 1)
        with KernelCounter() as counter:
            model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
    return counter
