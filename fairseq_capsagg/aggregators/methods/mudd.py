"""Multiway dynamic dense connections (MUDDFormer, Xiao et al. 2025)."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..ops.mudd_aggregate import mudd_aggregate, mudd_weights
from ..registry import register_aggregator
from ..settings import KernelSettings, setting

#: The inputs of a Transformer block that MUDD connections feed separately, in their order.
MULTIWAY_STREAMS = ("query", "key", "value", "residual")


@dataclass
class MUDDSettings(KernelSettings):
    mudd_hidden_dim: Optional[int] = setting(
        None, "MUDD: hidden width of each connection's weight MLP (default: streams x layers, as MUDDFormer)",
        metavar="H")


@register_aggregator
class MultiwayDynamicDense(LayerAggregator):
    """Omega_s = sum_l w_{s,l} H^l with w = W_2 GELU(W_1 RMSNorm(H^L)) + b, per position (MUDDFormer).

    The weights of every stream s over the L layers come from a small MLP of the
    newest layer at that position (normalised without a learned scale) plus a
    static bias b. Between blocks each connection feeds the next block's four
    inputs separately (:data:`MULTIWAY_STREAMS`: the query, key and value of
    its self-attention and its residual stream); after the top block and at the
    stack's output there is one stream. W_2 starts at zero and b at 1 on the
    newest layer, so the model starts as the vanilla Transformer. The weights
    are computed in fp32.

    Args:
        hidden_dim: the MLP's width.
        streams: S, the aggregates per position (1 or 4).
    """

    name = "mudd"
    multiway = True
    family = "mudd"
    label = "MUDD connections"
    Settings = MUDDSettings
    placements = ("output", "between-blocks")
    architecture_placement = "between-blocks"
    depth_first = True

    @classmethod
    def validate(cls, settings: MUDDSettings, embed_dim: int, side: str = "") -> None:
        super().validate(settings, embed_dim, side)
        hidden = settings.mudd_hidden_dim
        settings.require("mudd_hidden_dim", hidden is None or hidden >= 1, "it must be a positive integer")

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: MUDDSettings) -> "MultiwayDynamicDense":
        return cls(embed_dim, num_layers, settings.mudd_hidden_dim or num_layers,
                   kernels=settings.connection_kernels)

    @classmethod
    def between_blocks(cls, embed_dim: int, num_layers: int, settings: MUDDSettings,
                       last: bool) -> "MultiwayDynamicDense":
        streams = 1 if last else len(MULTIWAY_STREAMS)
        return cls(embed_dim, num_layers, settings.mudd_hidden_dim or streams * num_layers, streams,
                   settings.connection_kernels)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: MUDDSettings, streams: int = 1) -> float:
        """The normalisation, the MLP (d -> H -> S*L) and the S weighted sums."""
        hidden = settings.mudd_hidden_dim or streams * num_layers
        return embed_dim + embed_dim * hidden + hidden * streams * num_layers + streams * num_layers * embed_dim

    @classmethod
    def between_blocks_multiply_adds(cls, embed_dim: int, num_blocks: int, settings: MUDDSettings) -> float:
        return sum(cls.multiply_adds(embed_dim, block + 2, settings,
                                     1 if block == num_blocks - 1 else len(MULTIWAY_STREAMS))
                   for block in range(num_blocks))

    def __init__(self, embed_dim: int, num_layers: int, hidden_dim: int, streams: int = 1, kernels: str = "auto"):
        super().__init__(embed_dim, num_layers)
        self.streams = streams
        self.kernels = kernels
        self.fc1 = nn.Linear(embed_dim, hidden_dim, bias=False)
        self.fc2 = nn.Linear(hidden_dim, streams * num_layers, bias=False)
        nn.init.zeros_(self.fc2.weight)
        static = torch.zeros(streams, num_layers)
        static[:, -1] = 1.0
        self.static_weight = nn.Parameter(static)

    def effective_weights(self, layers: Tensor) -> Tensor:
        """w: (T, B, S, L) fp32 weights of each stream over the layers (L, T, B, C), per position."""
        return mudd_weights(layers[-1], self.fc1.weight, self.fc2.weight, self.static_weight)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Omega (S, T, B, C), or (T, B, C) for one stream, one operator each way with ``--connection-kernels
        fused`` (:mod:`.mudd_aggregate`)."""
        mixed = mudd_aggregate(layers, self.fc1.weight, self.fc2.weight, self.static_weight, self.kernels)
        return mixed.squeeze(0) if self.streams == 1 else mixed
