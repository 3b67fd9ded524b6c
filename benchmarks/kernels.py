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

from fairseq_capsagg.aggregators.base import gpu_checks_only

#: Operators that are no view by their schema but launch no kernel either.
NO_KERNEL = frozenset({"aten::_unsafe_view", "aten::empty", "aten::empty_like", "aten::empty_strided",
                       "aten::new_empty", "aten::new_empty_strided", "aten::lift_fresh"})


def launches_kernel(func: torch._ops.OpOverload) -> bool:
    """Whether ``func`` launches a kernel on a GPU."""
    return not func.is_view and func.overloadpacket._qualified_op_name not in NO_KERNEL


class KernelCounter(TorchDispatchMode):
    """Counts the kernel-launching operators dispatched while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_kernel(func):
            self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def training_step(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor, prev: torch.Tensor,
                  target: torch.Tensor, bf16: bool = False) -> Callable[[], None]:
    """One forward and backward pass of ``model`` in training mode, its gradients reset first."""
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(src, lengths, prev)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten()).backward()

    return step


def training_step_kernels(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                          prev: torch.Tensor, target: torch.Tensor, bf16: bool = False) -> KernelCounter:
    """The kernels of one forward and backward pass (after one uncounted pass, which builds what is built
    once)."""
    step = training_step(model, src, lengths, prev, target, bf16)
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
