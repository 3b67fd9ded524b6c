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

An operator that reads a stack can put its gradient of the stack into G itself (:meth:`LayerHistory.apply`): DWA's
and DLCL's weighted sums add w_l dX into G in one pass (G_l += w_l dX, :func:`weighted_sum`), attention over
depth's and MUDD's kernels add their gradient of the layers as they compute it, where writing it for G to read
and add would pass over the stack twice more.
"""

import functools
from typing import Callable, List, Optional, Sequence, Tuple

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
        #: The zero gradient an operator returned for the stack whose gradient it put into G itself.
        self.added: Optional[Tensor] = None

    def extend(self, layers: Sequence[Tensor]) -> Tensor:
        """Writes ``layers`` (each (T, B, C)) into the next slots and returns every slot written so far,
        (size, T, B, C): the stack of all the layers given since the first, depth first."""
        if self.size + len(layers) > self.depth:
            raise RuntimeError(f"a stack of {self.depth} layer outputs was given {self.size + len(layers)}")
        stacked = _Extend.apply(self, *layers)
        stacked.layer_history = self  # for the operators that put their gradient into G (apply)
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

    def apply(self, forward: Callable[..., Tensor], backward_into: Callable[..., Tuple[Optional[Tensor], ...]],
              layers: Tensor, *params: Tensor) -> Tensor:
        """``forward(layers, *params)`` of this history's stack ``layers`` (or a view of it of another shape),
        whose backward puts the stack's gradient into G itself: ``backward_into(grad, layers, *params, *saved,
        target, fresh)`` writes it into ``target`` (G's slots of the stack, shaped as ``layers``) if ``fresh``, else
        adds it there, and returns the gradients of ``params``; ``saved``: what ``forward`` returned after its output,
        where it returns a tuple."""
        return _IntoHistory.apply(forward, backward_into, self, layers, *params)

    def gradient_target(self, size: int) -> Tuple[Tensor, bool]:
        """G's first ``size`` slots for an operator to put its gradient of their stack into, and whether they are
        fresh (to be written: the top connection's backward comes first) or hold the gradients of the connections
        above (to be added to)."""
        fresh = self._start_gradient(size)
        return self.grad[:size], fresh

    def _start_gradient(self, size: int) -> bool:
        """Makes G where there is none yet and says whether its first ``size`` slots are fresh: to be written by the
        top connection's backward, which comes first; zeros where the connections above had no gradient."""
        if self.grad is not None:
            return False
        fresh = size == self.depth
        self.grad = self.buffer.new_empty(self.buffer.shape) if fresh else self.buffer.new_zeros(self.buffer.shape)
        return fresh

    def gradient_taken(self, like: Tensor) -> Tensor:
        """The zero gradient of a stack shaped ``like`` whose gradient is in G already, which :meth:`gradients`
        then knows not to add."""
        self.added = like.new_zeros(()).expand(like.shape)
        return self.added

    def gradients(self, grad: Tensor, slots: range, dtypes: Sequence[torch.dtype]) -> List[Tensor]:
        """The backward of :meth:`extend` that wrote ``slots`` (the stack it returned: slots 0..slots.stop - 1):
        adds ``grad`` into G, but the zero :meth:`gradient_taken` returned, then returns the gradients of the layers
        it wrote, in their dtypes."""
        added, self.added = self.added, None
        if added is None:
            fresh = self._start_gradient(slots.stop)
            put_gradient(self.grad[:slots.stop], grad, accumulate=not fresh)
        elif grad.data_ptr() != added.data_ptr() or any(grad.stride()):  # G holds an operator's share: add the rest
            self.grad[:slots.stop] += grad
        grads = [self.grad[slot].to(dtype) for slot, dtype in zip(slots, dtypes)]
        if slots.start == 0:  # the embedding's, the last gradient this history gives
            self.grad = None
        return grads


def history_of(layers: Tensor) -> Optional[LayerHistory]:
    """The history whose stack ``layers`` is, where autograd differentiates it; None elsewhere."""
    history = getattr(layers, "layer_history", None)
    return history if history is not None and torch.is_grad_enabled() and layers.requires_grad else None


def apply_to_stack(stack: Tensor, forward: Callable[..., Tensor],
                   backward_into: Callable[..., Tuple[Optional[Tensor], ...]], *inputs: Tensor) -> Tensor:
    """``forward(*inputs)`` of an operator that reads ``stack`` as ``inputs[0]`` (it, or a view of it of another
    shape): through :meth:`LayerHistory.apply` where ``stack`` is a history's, so that its backward puts the
    stack's gradient into the history's (``backward_into``); plainly elsewhere. An operator that also returns what its
    backward reads (a tuple: its output first) gives it to ``backward_into`` after its inputs; the output alone is
    returned."""
    history = history_of(stack)
    if history is None:
        return _outputs(forward(*inputs))[0]
    return history.apply(forward, backward_into, *inputs)


def weighted_sum(weight: Tensor, layers: Tensor) -> Tensor:
    """sum_l w_l H^l of the layers stacked depth first, (L, T, B, C), with ``weight`` (L,) cast to their
    precision. On a :class:`LayerHistory`'s stack its backward adds w_l dX into the history's gradient itself."""
    return apply_to_stack(layers, _weighted_sum, _weighted_sum_backward_into, layers, weight)


def _weighted_sum(layers: Tensor, weight: Tensor) -> Tensor:
    return torch.tensordot(weight.to(layers.dtype), layers, dims=1)


def _weighted_sum_backward_into(grad: Tensor, layers: Tensor, weight: Tensor, target: Tensor,
                                fresh: bool) -> Tuple[Tensor]:
    scale = weight.to(layers.dtype).view(-1, *(1,) * grad.dim())
    if fresh:
        torch.mul(scale, grad, out=target)
    else:
        target.addcmul_(scale, grad)
    return torch.tensordot(layers, grad, dims=grad.dim()).to(weight.dtype),


def put_gradient(target: Tensor, grad: Tensor, accumulate: bool) -> None:
    """Adds ``grad`` to ``target`` (``accumulate``), or writes it there: the reference of the kernels'
    ``ACCUMULATE`` that :meth:`LayerHistory.apply`'s ``backward_into`` asks for."""
    if accumulate:
        target.add_(grad)
    else:
        target.copy_(grad)


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


class _IntoHistory(torch.autograd.Function):
    """:meth:`LayerHistory.apply` each way."""

    @staticmethod
    def forward(ctx, forward: Callable[..., Tensor], backward_into: Callable[..., Tuple[Optional[Tensor], ...]],
                history: LayerHistory, layers: Tensor, *params: Tensor) -> Tensor:
        out, *saved = _outputs(forward(layers, *params))
        ctx.save_for_backward(layers, *params, *saved)
        ctx.backward_into, ctx.history, ctx.params = backward_into, history, len(params)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], ...]:
        layers, *rest = ctx.saved_tensors
        target, fresh = ctx.history.gradient_target(layers.size(0))
        grads = ctx.backward_into(grad, layers, *rest, target.view(layers.shape), fresh)
        return (None, None, None, ctx.history.gradient_taken(layers), *grads[:ctx.params])


def _outputs(result) -> Tuple[Tensor, ...]:
    """An operator's output, and what its backward reads after its inputs where it returns that too (a tuple)."""
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)
