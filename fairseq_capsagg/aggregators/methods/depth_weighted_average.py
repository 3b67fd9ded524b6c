"""DenseFormer's depth-weighted average (DWA) of layers (Pagliardini et al. 2024)."""

from typing import Optional

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..layer_history import weighted_sum
from ..registry import register_aggregator
from ..settings import Settings


@register_aggregator
class DepthWeightedAverage(LayerAggregator):
    """H~ = sum_l alpha_l H^l with one learned scalar alpha_l per layer (DenseFormer's DWA).

    Between blocks (DenseFormer's place) the connection after block i reads the
    embedding and the i block outputs, and its average is block i + 1's input; at
    the stack's output (the place of Dou et al.) it reads H^1..H^L. alpha starts
    at 1 on the newest layer and 0 on the others, so the model starts as the
    vanilla Transformer. DenseFormer's dilation and period (sparser connections
    for speed) are not implemented: at 6 layers every connection is cheap.
    """

    name = "dwa"
    family = "dwa"
    label = "DenseFormer DWA"
    placements = ("output", "between-blocks")
    architecture_placement = "between-blocks"
    depth_first = True

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: Settings) -> float:
        return num_layers * embed_dim

    def __init__(self, embed_dim: int, num_layers: int):
        super().__init__(embed_dim, num_layers)
        weight = torch.zeros(num_layers)
        weight[-1] = 1.0
        self.weight = nn.Parameter(weight)

    def effective_weights(self, layers: Tensor) -> Tensor:
        """(T, B, 1, L) fp32: the weight of each layer at each position (the same everywhere)."""
        return self.weight.float().expand(*layers.shape[1:3], 1, self.num_layers)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        return weighted_sum(self.weight, layers)
