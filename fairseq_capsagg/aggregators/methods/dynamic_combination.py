"""Dynamic combination of layers (Eq. 4 of Dou et al. 2019)."""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import LayerAggregator
from ..registry import register_aggregator
from ..settings import Settings, setting


@dataclass
class DynamicCombinationSettings(Settings):
    aggregation_ffn_dim: Optional[int] = setting(
        None, "dynamic combination: hidden width of each FFN_l (default: d)", metavar="F")


@register_aggregator
class DynamicCombination(LayerAggregator):
    """H~ = sum_l W_l * H^l with W_l = FFN_l(H^1, ..., H^L) in R^{J x d} (Eq. 4).

    Every layer l has its own two-layer network FFN_l that reads the
    concatenation [H^1; ...; H^L] at a position and outputs a weight vector of
    width d for that position, applied element-wise to H^l. The L first layers
    are one (L*d -> L*f) projection and the L second layers one batched
    (L, f, d) product, so no Python loop runs over layers.

    The second layers start at zero with a bias that selects the top layer, so
    a fresh aggregator reproduces the vanilla model exactly.

    Args:
        ffn_dim: f, the hidden width of each FFN_l.
    """

    name = "dynamic"
    family = "dyncomb"
    label = "Dynamic Combination"
    Settings = DynamicCombinationSettings

    @classmethod
    def validate(cls, settings: DynamicCombinationSettings, embed_dim: int, side: str = "") -> None:
        super().validate(settings, embed_dim, side)
        ffn_dim = settings.aggregation_ffn_dim
        settings.require("aggregation_ffn_dim", ffn_dim is None or ffn_dim >= 1, "it must be a positive integer")

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int,
                      settings: DynamicCombinationSettings) -> "DynamicCombination":
        return cls(embed_dim, num_layers, settings.aggregation_ffn_dim or embed_dim)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: DynamicCombinationSettings) -> float:
        """The L first layers (L*d -> L*f), the L second layers (f -> d) and the weighted sum."""
        ffn = settings.aggregation_ffn_dim or embed_dim
        return num_layers * embed_dim * num_layers * ffn + num_layers * ffn * embed_dim + num_layers * embed_dim

    def __init__(self, embed_dim: int, num_layers: int, ffn_dim: int):
        super().__init__(embed_dim, num_layers)
        self.ffn_dim = ffn_dim
        self.fc1 = nn.Linear(num_layers * embed_dim, num_layers * ffn_dim)
        nn.init.xavier_uniform_(self.fc1.weight)
        nn.init.zeros_(self.fc1.bias)
        self.fc2_weight = nn.Parameter(torch.zeros(num_layers, ffn_dim, embed_dim))
        bias = torch.zeros(num_layers, embed_dim)
        bias[-1] = 1.0
        self.fc2_bias = nn.Parameter(bias)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        t, b, num_layers, _ = layers.shape
        hidden = F.relu(self.fc1(layers.reshape(t, b, -1)))
        hidden = hidden.view(t, b, num_layers, self.ffn_dim)
        weights = torch.einsum("tblf,lfc->tblc", hidden, self.fc2_weight) + self.fc2_bias
        return (weights * layers).sum(dim=2)
