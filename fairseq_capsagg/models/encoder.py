"""Transformer encoder whose output aggregates all of its layers."""

from typing import Dict, List, Optional

from torch import Tensor

from fairseq.models.transformer import TransformerEncoderBase

from .aggregating_stack import AggregatingStack


class CapsAggTransformerEncoder(AggregatingStack, TransformerEncoderBase):
    """fairseq's Transformer encoder with H~ = Aggregate(H^1..H^L) as its output.

    The decoder cross-attends to the aggregate instead of the top layer H^L.
    The layers are collected on every call (generation asks for no hidden
    states, so they are always requested from the base class). In a pre-norm
    model the collected layers are raw residual streams, and the final
    LayerNorm, which normalises H^L in the vanilla model, is applied to the
    aggregate instead, so that ``none`` stays exactly the vanilla encoder.
    """

    side = "encoder"

    def __init__(self, cfg, dictionary, embed_tokens, return_fc: bool = False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.init_aggregation()

    def forward_scriptable(
        self,
        src_tokens,
        src_lengths: Optional[Tensor] = None,
        return_all_hiddens: bool = False,
        token_embeddings: Optional[Tensor] = None,
    ) -> Dict[str, List[Tensor]]:
        if not self.aggregates:
            return super().forward_scriptable(src_tokens, src_lengths, return_all_hiddens, token_embeddings)
        out = super().forward_scriptable(src_tokens, src_lengths, True, token_embeddings)
        x = self.aggregate(out["encoder_states"], out["encoder_padding_mask"][0])
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        out["encoder_out"] = [x]
        if not return_all_hiddens:
            out["encoder_states"] = []
            out["fc_results"] = []
        return out

    def upgrade_state_dict_named(self, state_dict, name):
        return self.fill_aggregator_keys(super().upgrade_state_dict_named(state_dict, name), name)
