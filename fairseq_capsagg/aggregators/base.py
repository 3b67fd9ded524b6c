"""The interface every layer aggregator implements."""

from typing import List, Optional

import torch
from torch import Tensor, nn


class NonFiniteAggregationError(FloatingPointError):
    """An aggregator turned finite layer outputs into NaN or inf; the message names where."""


class LayerAggregator(nn.Module):
    """Combines the L layer outputs H^1..H^L of a stack into one representation.

    Subclasses implement :meth:`aggregate` on the stacked layers. Every
    aggregator of this package works per position: the output at one
    position reads only that position's layer outputs, so padding, batching
    and incremental decoding cannot change it.

    Args:
        embed_dim: d, the width of each layer output.
        num_layers: L, how many layer outputs :meth:`forward` receives.
    """

    def __init__(self, embed_dim: int, num_layers: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_layers = num_layers
        self.side = ""  # "encoder" or "decoder", set by the model, for error messages

    def forward(self, layers: List[Tensor], padding_mask: Optional[Tensor] = None) -> Tensor:
        """Aggregates the layers.

        Args:
            layers: L tensors of shape (T, B, C), bottom layer first.
            padding_mask: (B, T), True at padded positions, or None.

        Returns:
            (T, B, C): the aggregated representation, zero at padded positions.
        """
        if len(layers) != self.num_layers:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_layers} layers but got "
                f"{len(layers)}; layer dropping (--encoder-layerdrop/--decoder-layerdrop) "
                "cannot be combined with layer aggregation"
            )
        stacked = torch.stack(layers, dim=2)
        out = self.aggregate(stacked, padding_mask)
        if padding_mask is not None:
            out = out.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        if self.training and not torch.isfinite(out).all() and torch.isfinite(stacked).all():
            # non-finite inputs (an fp16 overflow upstream) are left to fairseq's loss scaler
            raise NonFiniteAggregationError(self.describe_fault(stacked, padding_mask))
        return out

    def describe_fault(self, layers: Tensor, padding_mask: Optional[Tensor]) -> str:
        """Says where a non-finite output came from (called only when one did)."""
        return (f"{self.side or 'the'} aggregator {type(self).__name__} produced NaN/inf "
                "from finite layer outputs")

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Maps stacked layers (T, B, L, C) to (T, B, C)."""
        raise NotImplementedError
