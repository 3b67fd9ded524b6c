"""Transformer encoder whose output aggregates all of its layers."""

from typing import Dict, List, Optional

from torch import Tensor

from fairseq.models.transformer import TransformerEncoderBase

from ..aggregators import LayerAggregator, TopLayer
from .warm_start import fill_missing_keys


class CapsAggTransformerEncoder(TransformerEncoderBase):
    """fairseq's Transformer encoder with H~ = Aggregate(H^1..H^L) as its output.

    The decoder cross-attends to the aggregate instead of the top layer H^L.
    The layers are collected on every call (generation asks for no hidden
    states, so they are always requested from the base class). In a pre-norm
    model the collected layers are raw residual streams, and the final
    LayerNorm, which normalises H^L in the vanilla model, is applied to the
    aggregate instead, so that ``none`` stays exactly the vanilla encoder.

    The aggregator starts as :class:`TopLayer`; the model installs the
    configured one with :meth:`set_aggregator`.
    """

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.aggregate_embedding = False
        self.aggregator: LayerAggregator = TopLayer(cfg.encoder.embed_dim, cfg.encoder.layers)

    def set_aggregator(self, aggregator: LayerAggregator, aggregate_embedding: bool) -> None:
        aggregator.side = "encoder"
        self.aggregator = aggregator
        self.aggregate_embedding = aggregate_embedding

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ) -> Dict[str, List[Tensor]]:
        if isinstance(self.aggregator, TopLayer):
            return super().forward_scriptable(
                src_tokens, src_lengths, return_all_hiddens, token_embeddings
            )
        out = super().forward_scriptable(src_tokens, src_lengths, True, token_embeddings)
        states = out["encoder_states"]
        layers = states if self.aggregate_embedding else states[1:]
        x = self.aggregator(layers, out["encoder_padding_mask"][0])
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        out["encoder_out"] = [x]
        if not return_all_hiddens:
            out["encoder_states"] = []
            out["fc_results"] = []
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        return fill_missing_keys(self.aggregator, state_dict, f"{name}.aggregator" if name else "aggregator")
