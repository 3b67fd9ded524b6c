"""The vanilla Transformer's choice: only the top layer H^L is used."""

from typing import Optional

from torch import Tensor

from .base import LayerAggregator


class TopLayer(LayerAggregator):
    """Returns H^L unchanged (aggregation ``none``, the baseline)."""

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        return layers[:, :, -1]
