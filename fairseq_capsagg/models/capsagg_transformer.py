"""The ``capsagg_transformer`` model: a Transformer with layer aggregation."""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, base_architecture

from ..aggregators import (
    AGGREGATION_CHOICES,
    CAPSULE_INPUT_CHOICES,
    LINEAR_WEIGHT_CHOICES,
    AggregationConfig,
    AggregationConfigError,
    build_aggregator,
)
from .decoder import CapsAggTransformerDecoder
from .encoder import CapsAggTransformerEncoder


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
        choices = ", ".join(AGGREGATION_CHOICES)
        parser.add_argument("--encoder-aggregation", choices=AGGREGATION_CHOICES,
                            help=f"how the encoder combines its layers: {choices}")
        parser.add_argument("--decoder-aggregation", choices=AGGREGATION_CHOICES,
                            help=f"how the decoder combines its layers: {choices}")
        parser.add_argument("--aggregate-embedding", action="store_true",
                            help="also aggregate the embedding layer output H^0 (off in the paper)")
        parser.add_argument("--output-capsules", type=int, metavar="N",
                            help="routing: output capsules of width d/N; N must divide d "
                                 "(default: d, scalar capsules)")
        parser.add_argument("--routing-iters", type=int, metavar="T",
                            help="routing: iterations T (default 3)")
        parser.add_argument("--capsule-input", choices=CAPSULE_INPUT_CHOICES,
                            help="routing: input capsules from all layers F_l(H^1..H^L) "
                                 "(all, default) or from their own layer F_l(H^l) (layer)")
        parser.add_argument("--aggregation-ffn-dim", type=int, metavar="F",
                            help="dynamic combination: hidden width of each FFN_l (default: d)")
        parser.add_argument("--linear-combination-weights", choices=LINEAR_WEIGHT_CHOICES,
                            help="linear combination: W_l in R^d (vector, default) or "
                                 "R^{d x d} (matrix)")
        parser.add_argument("--em-inverse-temperature", type=float, metavar="LAMBDA",
                            help="EM routing: final inverse temperature lambda (default 1.0)")
        parser.add_argument("--capsule-rank", type=int, metavar="R",
                            help="routing: factorise the input-capsule maps F_l through a shared "
                                 "rank-R bottleneck (default 0: the paper's L distinct maps)")
        parser.add_argument("--compile-routing", action="store_true",
                            help="routing: fuse the T routing iterations (forward and backward) "
                                 "with torch.compile; same results, less time per update")

    @classmethod
    def build_model(cls, args, task):
        capsagg_base_architecture(args)
        if args.encoder_layerdrop > 0 and args.encoder_aggregation != "none":
            raise AggregationConfigError(
                "--encoder-layerdrop must be 0 with --encoder-aggregation "
                f"{args.encoder_aggregation}: the aggregator needs every layer's output"
            )
        if args.decoder_layerdrop > 0 and args.decoder_aggregation != "none":
            raise AggregationConfigError(
                "--decoder-layerdrop must be 0 with --decoder-aggregation "
                f"{args.decoder_aggregation}: the aggregator needs every layer's output"
            )
        cfg = AggregationConfig.from_args(args)
        extra = 1 if args.aggregate_embedding else 0
        encoder_layers = len(args.encoder_layers_to_keep.split(",")) if args.encoder_layers_to_keep \
            else args.encoder_layers
        decoder_layers = len(args.decoder_layers_to_keep.split(",")) if args.decoder_layers_to_keep \
            else args.decoder_layers
        encoder_aggregator = build_aggregator(
            args.encoder_aggregation, args.encoder_embed_dim, encoder_layers + extra, cfg, "encoder"
        )
        decoder_aggregator = build_aggregator(
            args.decoder_aggregation, args.decoder_embed_dim, decoder_layers + extra, cfg, "decoder"
        )
        model = super().build_model(args, task)
        model.encoder.set_aggregator(encoder_aggregator, args.aggregate_embedding)
        model.decoder.set_aggregator(decoder_aggregator, args.aggregate_embedding)
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
    args.aggregate_embedding = getattr(args, "aggregate_embedding", False)
    args.output_capsules = getattr(args, "output_capsules", None)
    args.routing_iters = getattr(args, "routing_iters", 3)
    args.capsule_input = getattr(args, "capsule_input", "all")
    args.aggregation_ffn_dim = getattr(args, "aggregation_ffn_dim", None)
    args.linear_combination_weights = getattr(args, "linear_combination_weights", "vector")
    args.em_inverse_temperature = getattr(args, "em_inverse_temperature", 1.0)
    args.capsule_rank = getattr(args, "capsule_rank", 0)
    args.compile_routing = getattr(args, "compile_routing", False)
    base_architecture(args)
