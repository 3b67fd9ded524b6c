"""Transformer decoder that predicts from an aggregate of all of its layers."""

from typing import Dict, List, Optional

from torch import Tensor

from fairseq.models.transformer import TransformerDecoderBase

from .aggregating_stack import AggregatingStack


class CapsAggTransformerDecoder(AggregatingStack, TransformerDecoderBase):
    """fairseq's Transformer decoder with the output projection reading
    H~ = Aggregate(H^1..H^L) instead of H^L.

    Aggregation works per position on the ``inner_states`` that the base class
    always collects, so incremental decoding needs no extra cache: at each step
    only the new position is aggregated. In a pre-norm model the final
    LayerNorm is applied to the aggregate (see the encoder).
    """

    side = "decoder"

    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn: bool = False,
                 output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        self.init_aggregation()

    def extract_features(
        self,
        prev_output_tokens,
        encoder_out: Optional[Dict[str, List[Tensor]]],
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        full_context_alignment: bool = False,
        alignment_layer: Optional[int] = None,
        alignment_heads: Optional[int] = None,
    ):
        x, extra = self.extract_features_scriptable(
            prev_output_tokens, encoder_out, incremental_state, full_context_alignment,
            alignment_layer, alignment_heads,
        )
        if not self.aggregates:
            return x, extra
        tokens = prev_output_tokens if incremental_state is None else prev_output_tokens[:, -1:]
        # always passed (no host sync on .any() at every decoding step); an all-False mask is a no-op
        x = self.aggregate(extra["inner_states"], tokens.eq(self.padding_idx))
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, extra

    def upgrade_state_dict_named(self, state_dict, name):
        return self.fill_aggregator_keys(super().upgrade_state_dict_named(state_dict, name), name)
