"""The ``capsagg_transformer`` model: a Transformer with layer aggregation."""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, base_architecture

from ..aggregators import aggregation_choices, dense_connection_choices, families, family_class, settings_classes
from ..aggregators.settings import add_flags, distinct_fields, fill_defaults
from .aggregating_stack import AggregationPlan, StackSettings
from .decoder import CapsAggTransformerDecoder
from .encoder import CapsAggTransformerEncoder


def aggregation_fields():
    """The fields of every aggregation flag: the stacks' and each registered aggregator's."""
    return distinct_fields([StackSettings, *settings_classes()])


def architecture_values():
    """Per setting, the families whose architectures set it otherwise than its flag's default, as its help says
    so (``transformer_dynrouting_* architectures: 2``)."""
    values = {}
    for family in families():
        for name, value in family_class(family).architecture_settings.items():
            values.setdefault(name, []).append(f"transformer_{family}_* architectures: {value}")
    return {name: "; ".join(texts) for name, texts in values.items()}


@register_model("capsagg_transformer")
class CapsAggTransformerModel(TransformerModel):
    """Transformer (Vaswani et al. 2017) whose encoder and decoder aggregate
    their layer outputs (Dou et al. 2019).

    ``--encoder-aggregation`` and ``--decoder-aggregation`` choose the
    aggregator of each side independently; ``none`` keeps that side vanilla.
    """

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        choices = aggregation_choices()
        for side in ("encoder", "decoder"):
            parser.add_argument(f"--{side}-aggregation", choices=choices,
                                help=f"how the {side} combines its layers at its output: {', '.join(choices)}")
            dense = dense_connection_choices()
            parser.add_argument(f"--{side}-dense-connections", choices=dense,
                                help=f"what every {side} block reads instead of the block below it: an aggregate "
                                     f"of the embedding and all earlier blocks ({', '.join(dense)})")
        add_flags(parser, aggregation_fields(), architecture_values())

    @classmethod
    def build_model(cls, args, task):
        capsagg_base_architecture(args)
        plan = AggregationPlan.from_args(args)  # every check before any module is built
        model = super().build_model(args, task)
        model.encoder.build_aggregation(plan.encoder)
        model.decoder.build_aggregation(plan.decoder)
        return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return CapsAggTransformerEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return CapsAggTransformerDecoder(
            cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention
        )


def capsagg_base_architecture(args) -> None:
    """Fills the aggregation flags and the Transformer defaults that are unset."""
    args.encoder_aggregation = getattr(args, "encoder_aggregation", "none")
    args.decoder_aggregation = getattr(args, "decoder_aggregation", "none")
    args.encoder_dense_connections = getattr(args, "encoder_dense_connections", "none")
    args.decoder_dense_connections = getattr(args, "decoder_dense_connections", "none")
    fill_defaults(args, aggregation_fields())
    base_architecture(args)
