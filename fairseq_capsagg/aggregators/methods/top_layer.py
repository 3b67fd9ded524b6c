"""The vanilla Transformer's choice: only the top layer H^L is used."""

from typing import Optional

from torch import Tensor

from ..base import LayerAggregator
from ..registry import register_aggregator
from ..settings import Settings


@register_aggregator
class TopLayer(LayerAggregator):
    """Returns H^L unchanged (aggregation ``none``, the baseline).

    The model installs no aggregator on a ``none`` side (its stack is the vanilla one); this
    class is the baseline for code that uses the aggregators on their own.
    """

    name = "none"
    label = "Transformer"

    @classmethod
    def check_num_layers(cls, num_layers: int) -> None:
        """The top layer of any stack can be returned."""

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: Settings) -> float:
        return 0.0

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        return layers[:, :, -1]
