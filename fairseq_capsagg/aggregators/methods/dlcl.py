"""Dynamic linear combination of layers, DLCL (Wang et al., "Learning Deep Transformer Models for
Machine Translation", ACL 2019)."""

from typing import List, Optional

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..layer_history import weighted_sum
from ..registry import register_aggregator
from ..settings import Settings


@register_aggregator
class DynamicLinearCombination(LayerAggregator):
    """x = sum_k W_k LN_k(y_k): a learned linear combination of the layer-normalised outputs y_0 (the
    embedding) ... y_l of the earlier layers (Wang et al. 2019, Eqs. 6-7, pre-norm).

    Between blocks (DLCL's place) the connection after block l reads the embedding and the l block
    outputs and its combination is block l + 1's input; every layer output has one LayerNorm, shared by
    all the connections that read it, as the paper normalises each y_k once. At the stack's output it
    combines the normalised H^1..H^L. W starts as the uniform average, as the paper's does, so unlike
    the other peers a fresh DLCL model is *not* the Transformer it extends.
    """

    name = "dlcl"
    family = "dlcl"
    label = "DLCL"
    placements = ("output", "between-blocks")
    architecture_placement = "between-blocks"
    depth_first = True
    starts_as_transformer = False

    def __init__(self, embed_dim: int, num_layers: int, norms: Optional[nn.ModuleList] = None):
        super().__init__(embed_dim, num_layers)
        self.weight = nn.Parameter(torch.full((num_layers,), 1.0 / num_layers))
        self.norms = norms if norms is not None else nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_layers))
        if len(self.norms) != num_layers:
            raise ValueError(f"{len(self.norms)} LayerNorms for {num_layers} layers")

    @classmethod
    def connect_blocks(cls, embed_dim: int, num_blocks: int, settings: Settings) -> List["DynamicLinearCombination"]:
        """The connections after each block, sharing one LayerNorm per layer output (the embedding's first): the
        stack holds each output normalised once, which every connection after it reads
        (:class:`~fairseq_capsagg.aggregators.layer_history.LayerHistory`)."""
        norms = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_blocks + 1))
        return [cls(embed_dim, block + 2, nn.ModuleList(norms[:block + 2])) for block in range(num_blocks)]

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: Settings) -> float:
        """One LayerNorm per layer (about 4 operations per element) and the weighted sum."""
        return 5 * num_layers * embed_dim

    @classmethod
    def between_blocks_multiply_adds(cls, embed_dim: int, num_blocks: int, settings: Settings) -> float:
        """Each layer output is normalised once; connection l sums l + 1 of them."""
        return 4 * (num_blocks + 1) * embed_dim + sum((block + 2) * embed_dim for block in range(num_blocks))

    def effective_weights(self, layers: Tensor) -> Tensor:
        """(T, B, 1, L) fp32: the weight of each normalised layer at each position (the same everywhere)."""
        return self.weight.float().expand(*layers.shape[1:3], 1, self.num_layers)

    def stack_input(self, index: int, layer: Tensor) -> Tensor:
        """LN_k(y_k) for k = ``index``: what the stack (L, T, B, C) holds of y_k."""
        return self.norms[index](layer)

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """sum_k W_k LN_k(y_k) of the normalised outputs :meth:`stack` hands over."""
        return weighted_sum(self.weight, layers)
