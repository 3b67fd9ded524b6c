"""The layer outputs of a densely connected stack, held in one buffer that every connection reads.

The connection after block i reads B_0..B_i stacked depth first, (i + 1, T, B, C). Stacking them for each
connection writes a stack of N blocks N(N + 3)/2 layer outputs in the forward, again in the backward where the
stacks are saved as their layers, and autograd adds each B_j's gradients one connection at a time.
:class:`LayerHistory` writes each B_i once, into slot i of one (N + 1, T, B, C) buffer, and hands connection i
the buffer's first i + 1 slots: a view, not a copy, and what its operators save for the backward. Its gradient
goes the same way: each connection's backward adds the gradient of the slots it read into one buffer G of the same
shape, and returns slot i of G as B_i's. B_i is read only by the connections after blocks i, i + 1, ..., N, whose
backwards run before connection i's (each reads the blocks above connection i's output), so slot i of G is B_i's
whole gradient when connection i's backward returns it. Values are the stack's, bit for bit.

A connection that is a weighted sum of its stack (:func:`weighted_sum`: DWA, DLCL) adds w_l dX into G in one pass
(G_l += w_l dX), where the sum's own backward would write the product w_l dX for every slot and G then read it.
"""

import functools
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable


class LayerHistory:
    """The layers B_0..B_N of one forward pass of one stack, written once each into one buffer.

    Args:
        depth: N + 1, the layer outputs the stack will hold (the embedding's and one per block).
    """

    def __init__(self, depth: int):
        self.depth = depth
        self.size = 0
        self.buffer: Optional[Tensor] = None
        self.grad: Optional[Tensor] = None  # G, the gradient of the whole buffer, in the backward
        #: The zero gradient an operator returned for the stack whose gradient it added into G itself.
        self.added: Optional[Tensor] = None

    def extend(self, layers: Sequence[Tensor]) -> Tensor:
        """Writes ``layers`` (each (T, B, C)) into the next slots and returns every slot written so far,
        (size, T, B, C): the stack of all the layers given since the first, depth first."""
        if self.size + len(layers) > self.depth:
            raise RuntimeError(f"a stack of {self.depth} layer outputs was given {self.size + len(layers)}")
        stacked = _Extend.apply(self, *layers)
        stacked.layer_history = self  # for the operators that add their gradient into G (weighted_sum)
        return stacked

    def write(self, layers: Sequence[Tensor]) -> Tensor:
        """The forward of :meth:`extend`, outside autograd."""
        if self.buffer is None:
            self.buffer = layers[0].new_empty((self.depth, *layers[0].shape), dtype=_promoted(layers))
        elif any(layer.dtype != self.buffer.dtype for layer in layers):  # promoted, as torch.stack does
            self.buffer = self.buffer.to(_promoted([self.buffer, *layers]))
        for layer in layers:
            if layer.shape != self.buffer.shape[1:]:
                raise ValueError(f"layer outputs of shape {tuple(layer.shape)} and {tuple(self.buffer.shape[1:])} "
                                 "cannot be stacked")
        torch.stack(layers, out=self.buffer[self.size:self.size + len(layers)])  # one kernel
        self.size += len(layers)
        return _alias(self.buffer, self.size)

    def add_weighted(self, size: int, weight: Tensor, grad: Tensor) -> Tensor:
        """G_l += w_l ``grad`` for the stack of the first ``size`` slots (``weight`` (size,)); returns the zero
        gradient for that stack, which :meth:`gradients` then knows not to add."""
        scaled = weight.to(self.buffer.dtype).view(-1, *(1,) * grad.dim())
        if size == self.depth:  # the top connection's backward, the first
            self.grad = scaled * grad
        else:
            if self.grad is None:  # the connections above had no gradient
                self.grad = grad.new_zeros((self.depth, *grad.shape), dtype=self.buffer.dtype)
            self.grad[:size].addcmul_(scaled, grad)
        self.added = grad.new_zeros((), dtype=self.buffer.dtype).expand(size, *grad.shape)
        return self.added

    def gradients(self, grad: Tensor, slots: range, dtypes: Sequence[torch.dtype]) -> List[Tensor]:
        """The backward of :meth:`extend` that wrote ``slots`` (the stack it returned: slots 0..slots.stop - 1):
        adds ``grad`` into G, but the zero :meth:`add_weighted` returned, then returns the gradients of the layers
        it wrote, in their dtypes."""
        added, self.added = self.added, None
        if added is not None:  # G holds the weighted sum's share: add what other operators gave, if any
            if grad.data_ptr() != added.data_ptr() or grad.stride() != added.stride():
                self.grad[:slots.stop] += grad
        elif slots.stop == self.depth:  # the top connection's backward, the first
            self.grad = grad.to(self.buffer.dtype, memory_format=torch.contiguous_format, copy=True)
        else:
            if self.grad is None:  # the connections above had no gradient
                self.grad = grad.new_zeros((self.depth, *grad.shape[1:]), dtype=self.buffer.dtype)
            self.grad[:slots.stop] += grad
        grads = [self.grad[slot].to(dtype) for slot, dtype in zip(slots, dtypes)]
        if slots.start == 0:  # the embedding's, the last gradient this history gives
            self.grad = None
        return grads


def weighted_sum(weight: Tensor, layers: Tensor) -> Tensor:
    """sum_l w_l H^l of the layers stacked depth first, (L, T, B, C), with ``weight`` (L,) cast to their
    precision. On a :class:`LayerHistory`'s stack its backward adds w_l dX into the history's gradient itself."""
    history: Optional[LayerHistory] = getattr(layers, "layer_history", None)
    if history is None or not (torch.is_grad_enabled() and layers.requires_grad):
        return torch.tensordot(weight.to(layers.dtype), layers, dims=1)
    return _WeightedSum.apply(weight, layers, history)


def _promoted(tensors: Sequence[Tensor]) -> torch.dtype:
    """The dtype torch.stack gives ``tensors``."""
    dtypes = {t.dtype for t in tensors}
    return dtypes.pop() if len(dtypes) == 1 else functools.reduce(torch.promote_types, dtypes)


def _alias(buffer: Tensor, size: int) -> Tensor:
    """Slots 0..size - 1 of ``buffer`` as a tensor of their own: it shares the buffer's memory but not its version
    counter, so writing a later slot does not mark the earlier slots an operator saved as changed (they are not)."""
    return buffer.new_empty(0).set_(buffer.untyped_storage(), buffer.storage_offset(), (size, *buffer.shape[1:]),
                                    buffer.stride())


class _Extend(torch.autograd.Function):
    """:meth:`LayerHistory.extend` each way."""

    @staticmethod
    def forward(ctx, history: LayerHistory, *layers: Tensor) -> Tensor:
        ctx.history = history
        ctx.slots = range(history.size, history.size + len(layers))
        ctx.dtypes = [layer.dtype for layer in layers]
        return history.write(layers)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        return (None, *ctx.history.gradients(grad, ctx.slots, ctx.dtypes))


class _WeightedSum(torch.autograd.Function):
    """:func:`weighted_sum` of a history's stack each way."""

    @staticmethod
    def forward(ctx, weight: Tensor, layers: Tensor, history: LayerHistory) -> Tensor:
        cast = weight.to(layers.dtype)
        ctx.save_for_backward(cast, layers)
        ctx.weight_dtype = weight.dtype
        ctx.history = history
        return torch.tensordot(cast, layers, dims=1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        cast, layers = ctx.saved_tensors
        grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_weight = torch.tensordot(layers, grad, dims=grad.dim()).to(ctx.weight_dtype)
        return grad_weight, ctx.history.add_weighted(layers.size(0), cast, grad), None
