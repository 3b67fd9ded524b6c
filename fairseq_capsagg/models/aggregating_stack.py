"""What the aggregating encoder and decoder share: holding an aggregator and its warm start."""

from typing import Dict, List

from torch import Tensor, nn

from ..aggregators import LayerAggregator, TopLayer
from .warm_start import fill_missing_keys


class AggregatingStack(nn.Module):
    """Mixin for a fairseq layer stack whose output is an aggregate of its layers.

    The aggregator starts as :class:`TopLayer` (the vanilla stack); the model
    installs the configured one with :meth:`set_aggregator`.
    """

    side = ""

    def init_aggregator(self, embed_dim: int, num_layers: int) -> None:
        self.aggregate_embedding = False
        self.aggregator: LayerAggregator = TopLayer(embed_dim, num_layers)

    def set_aggregator(self, aggregator: LayerAggregator, aggregate_embedding: bool) -> None:
        aggregator.side = self.side
        self.aggregator = aggregator
        self.aggregate_embedding = aggregate_embedding

    @property
    def aggregates(self) -> bool:
        return not isinstance(self.aggregator, TopLayer)

    def aggregated_layers(self, states: List[Tensor]) -> List[Tensor]:
        """The collected states (embedding output first) that the aggregator reads."""
        return states if self.aggregate_embedding else states[1:]

    def fill_aggregator_keys(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Lets a checkpoint without aggregator weights (a vanilla Transformer) load strictly."""
        return fill_missing_keys(self.aggregator, state_dict, f"{name}.aggregator" if name else "aggregator")
