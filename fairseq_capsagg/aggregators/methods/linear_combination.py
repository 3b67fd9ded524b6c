"""Static linear combination of layers (Dou et al. 2018; Eq. 3 of Dou et al. 2019)."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..registry import register_aggregator
from ..settings import Settings, setting


@dataclass
class LinearCombinationSettings(Settings):
    linear_combination_weights: str = setting(
        "vector", "linear combination: W_l in R^d (vector) or R^{d x d} (matrix)", choices=("vector", "matrix"))


@register_aggregator
class LinearCombination(LayerAggregator):
    """H~ = sum_l W_l H^l (Eq. 3), with weights that do not depend on the input.

    The paper writes W_l in R^d yet calls them "parameter matrices". Both
    readings are offered:

    * ``vector`` (default): W_l in R^d scales H^l element-wise. This is the
      static counterpart of dynamic combination (Eq. 4), whose W_l in
      R^{J x d} adds the position axis J that a static weight cannot have
      because sentence lengths vary.
    * ``matrix``: W_l in R^{d x d} maps H^l linearly, so layers can also mix
      dimensions; d*d parameters per layer.

    W is initialised to select the top layer (W_L = 1 or I, the others 0), so
    a fresh aggregator reproduces the vanilla model exactly.
    """

    name = "linear"
    family = "linagg"
    label = "Linear Combination"
    Settings = LinearCombinationSettings

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: LinearCombinationSettings) -> "LinearCombination":
        return cls(embed_dim, num_layers, settings.linear_combination_weights)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: LinearCombinationSettings) -> float:
        return num_layers * embed_dim * (embed_dim if settings.linear_combination_weights == "matrix" else 1)

    def __init__(self, embed_dim: int, num_layers: int, weights: str = "vector"):
        super().__init__(embed_dim, num_layers)
        self.weights = weights
        if weights == "vector":
            weight = torch.zeros(num_layers, embed_dim)
            weight[-1] = 1.0
        else:
            weight = torch.zeros(num_layers, embed_dim, embed_dim)
            weight[-1] = torch.eye(embed_dim)
        self.weight = nn.Parameter(weight)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        if self.weights == "vector":
            return torch.einsum("tblc,lc->tbc", layers, self.weight)
        return torch.einsum("tblk,lck->tbc", layers, self.weight)
