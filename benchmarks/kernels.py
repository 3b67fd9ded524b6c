"""Operators dispatched per training step and per incremental decoding step: the CPU's proxy for kernel launches.

Every ATen operator a step dispatches is one kernel launch on a GPU (views and other metadata-only operators
excepted, which are few and equal across the families); where the arithmetic is small, as in a `base` model in
bf16, launches and their Python overhead bound the step's time. Counted with a ``TorchDispatchMode`` on any
device, so a change that adds or removes launches shows without a GPU. A fused operator (one
``torch.library`` custom op, a Triton kernel on CUDA) counts once.
"""

import collections
from typing import Counter, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OperatorCounter(TorchDispatchMode):
    """Counts the ATen operators dispatched while it is active, by name."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def training_step_operators(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                            prev: torch.Tensor, target: torch.Tensor, bf16: bool = False) -> OperatorCounter:
    """The operators of one forward and backward pass (after one uncounted pass, which builds what is built
    once)."""
    model.train()

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(src, lengths, prev)
        torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten()).backward()

    step()
    with OperatorCounter() as counter:
        step()
    return counter


def decoding_step_operators(model: torch.nn.Module, src: torch.Tensor, lengths: torch.Tensor,
                            eos: int) -> OperatorCounter:
    """The operators of the decoder's second incremental step (the first fills its caches)."""
    model.eval()
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=lengths)
        state: Dict[str, Dict[str, torch.Tensor]] = {}
        tokens = torch.full((src.size(0), 1), eos, device=src.device)
        model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
        tokens = torch.cat([tokens, src[:, :1]], 1)
        with OperatorCounter() as counter:
            model.decoder(tokens, encoder_out=encoder_out, incremental_state=state)
    return counter
