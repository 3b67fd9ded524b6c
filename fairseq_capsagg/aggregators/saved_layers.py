"""Stacked layers saved for backward as the layer outputs they were stacked from.

An aggregator reads its L inputs stacked, one (L, T, B, C) or (T, B, L, C) copy, and the operators it runs
save that copy for their backward. Between blocks this costs a stack of N blocks N(N + 3)/2 saved copies of a
layer output where the layer outputs themselves are N + 1: the connection after block i saves i + 1 of them
again. :func:`saved_as_layers` saves references to the layer outputs instead (held once, by every
connection that reads them) and stacks them again when the backward first reads the copy, one copy per
connection, freed with its backward. Values and gradients are unchanged; only what autograd holds is
(``torch.autograd.graph.saved_tensors_hooks``).
"""

import contextlib
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor


class _SavedLayers:
    """The layers a stack was made of, with their versions: the stack and its views rebuilt on demand."""

    def __init__(self, layers: Sequence[Tensor], dim: int):
        self.layers = list(layers)
        self.versions = [layer._version for layer in self.layers]
        self.dim = dim
        self._stacked: Optional[Tensor] = None

    def stacked(self) -> Tensor:
        """The stack, made again at the first call and shared by the later ones; without a graph, as autograd
        gives what it unpacks the graph of the tensor it saved (a second-order gradient still differentiates
        the stack)."""
        if self._stacked is None:
            if [layer._version for layer in self.layers] != self.versions:
                raise RuntimeError("a layer output that an aggregator saved for backward was modified in place "
                                   "after its forward")
            with torch.no_grad():
                self._stacked = torch.stack(self.layers, dim=self.dim)
        return self._stacked


class _SavedView:
    """One saved tensor that was the stack or a view of it: its geometry within the stack."""

    def __init__(self, source: _SavedLayers, tensor: Tensor):
        self.source = source
        self.geometry: Tuple[Tuple[int, ...], Tuple[int, ...], int] = (
            tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())

    def tensor(self) -> Tensor:
        stacked = self.source.stacked()
        size, stride, offset = self.geometry
        if size == tuple(stacked.shape) and stride == tuple(stacked.stride()) and offset == 0:
            return stacked
        return stacked.as_strided(size, stride, offset)


@contextlib.contextmanager
def saved_as_layers(stacked: Tensor, layers: List[Tensor], dim: int) -> Iterator[None]:
    """Within it, autograd saves ``stacked`` (``torch.stack(layers, dim)``) and any view of it as ``layers``.

    Every other saved tensor is saved as usual. Outside autograd (no grad, or nothing requiring it) it does
    nothing.
    """
    if not (torch.is_grad_enabled() and stacked.requires_grad):
        yield
        return
    source = _SavedLayers(layers, dim)
    # what identifies the stack, not the stack: autograd keeps the hooks, and with them what they refer to
    storage, dtype, device, version = stacked.untyped_storage().data_ptr(), stacked.dtype, stacked.device, \
        stacked._version

    def pack(tensor: Tensor):
        if tensor.dtype == dtype and tensor.device == device and tensor.untyped_storage().data_ptr() == storage \
                and tensor._version == version:  # the stack as it was made, not modified in place since
            return _SavedView(source, tensor)
        return tensor

    def unpack(saved):
        return saved.tensor() if isinstance(saved, _SavedView) else saved

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
