"""Attention over depth: a softmax over the layers with a learned query (Kimi's attention residuals, 2026)."""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..base import LayerAggregator
from ..numerics import rms_normalise
from ..ops.depth_softmax import depth_softmax, depth_weights
from ..registry import register_aggregator
from ..settings import KernelSettings, setting


@dataclass
class DepthAttentionSettings(KernelSettings):
    depth_attention_query: str = setting(
        "static", "depth attention: one learned query per connection (static, as attention residuals) or a "
                  "query computed from the newest layer (dynamic)", choices=("static", "dynamic"))


@register_aggregator
class DepthAttention(LayerAggregator):
    """H~ = H^L + g (sum_l alpha_l H^l - H^L), alpha = softmax_l(q . RMSNorm(H^l)).

    Attention residuals (Kimi Team 2026) attend over depth: the keys are
    the RMS-normalised layers (no learned scale), the values the layers
    themselves, the query a learned vector per connection (``static``, zero at
    the start: a uniform average) or, as in DeepCrossAttention's input-dependent
    weights, a linear map of the newest normalised layer (``dynamic``, zero
    weight and bias at the start). The logits and the softmax run in fp32.

    Two choices are ours, not the papers': the values are this plugin's layer
    outputs (residual streams, as every other aggregator here reads them) rather
    than each sublayer's increment, and a scalar gate g, zero at the start, mixes
    the attention into H^L, so the model starts as the vanilla Transformer (a
    softmax cannot put all its weight on one layer). g learns from the first
    update; the query from the second (its gradient is g times the attention's).
    """

    name = "depth-attention"
    family = "depthattn"
    label = "Attention over depth"
    Settings = DepthAttentionSettings
    placements = ("output", "between-blocks")
    architecture_placement = "between-blocks"
    depth_first = True

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: DepthAttentionSettings) -> "DepthAttention":
        return cls(embed_dim, num_layers, settings.depth_attention_query, settings.connection_kernels)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: DepthAttentionSettings) -> float:
        """Normalised keys, their logits and the weighted sum (and the dynamic query's map)."""
        query = embed_dim * embed_dim if settings.depth_attention_query == "dynamic" else 0
        return 3 * num_layers * embed_dim + query

    def __init__(self, embed_dim: int, num_layers: int, query: str = "static", kernels: str = "auto"):
        super().__init__(embed_dim, num_layers)
        self.query_kind = query
        self.kernels = kernels
        if query == "static":
            self.query = nn.Parameter(torch.zeros(embed_dim))
        else:
            self.query_proj = nn.Linear(embed_dim, embed_dim)
            nn.init.zeros_(self.query_proj.weight)
            nn.init.zeros_(self.query_proj.bias)
        self.gate = nn.Parameter(torch.zeros(()))

    def query_of(self, layers: Tensor) -> Tensor:
        """q: the static query (C), or the dynamic one of every position (T, B, C) in fp32, from the newest of the
        layers (L, T, B, C)."""
        if self.query_kind == "static":
            return self.query
        return F.linear(rms_normalise(layers[-1]), self.query_proj.weight.float(), self.query_proj.bias.float())

    def mixing(self, layers: Tensor) -> Tensor:
        """(L, T, B) fp32: the weight of each layer in H~, g alpha_l plus 1 - g on H^L (:mod:`.depth_softmax`)."""
        return depth_weights(layers, self.query_of(layers), self.gate)

    def effective_weights(self, layers: Tensor) -> Tensor:
        """(T, B, 1, L) fp32: :meth:`mixing` per position."""
        return self.mixing(layers).permute(1, 2, 0).unsqueeze(2)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """sum_l w_l H^l with w = :meth:`mixing`, one fused operator each way where ``--connection-kernels`` runs
        it (:mod:`.depth_softmax`): at g = 0 exactly H^L."""
        return depth_softmax(layers, self.query_of(layers), self.gate, self.kernels)
