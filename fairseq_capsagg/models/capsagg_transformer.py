"""The ``capsagg_transformer`` model: a Transformer with layer aggregation."""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel, base_architecture

from ..aggregators import (
    AGGREGATION_CHOICES,
    CAPSULE_INPUT_CHOICES,
    LINEAR_WEIGHT_CHOICES,
    ROUTING_CHOICES,
    ROUTING_INIT_CHOICES,
    AggregationConfig,
    AggregationConfigError,
    build_aggregator,
)
from .decoder import CapsAggTransformerDecoder

SWITCH_CHOICES = ("on", "off")
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
        parser.add_argument("--routing-init", choices=ROUTING_INIT_CHOICES,
                            help="routing: random (default; every F_l and W_l->n by its own fan-in/out) "
                                 "or identity (input capsules and votes carry H^L, for warm starts)")
        parser.add_argument("--aggregation-ramp-updates", type=int, metavar="K",
                            help="start from H^L and ramp the aggregate in: H~ = (1 - a) H^L + a Omega, "
                                 "a = t/K over the first K updates of the run (default 0: no ramp)")
        parser.add_argument("--aggregation-layer-norm", choices=SWITCH_CHOICES,
                            help="pre-norm sides: a LayerNorm on each aggregated layer before the "
                                 "aggregator, as the raw residual streams grow with depth; post-norm "
                                 "sides: a LayerNorm on a routed aggregate (default on)")

    @classmethod
    def build_model(cls, args, task):
        capsagg_base_architecture(args)
        validate_stack_flags(args)
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
        for stack, aggregator in ((model.encoder, encoder_aggregator), (model.decoder, decoder_aggregator)):
            aggregates = getattr(args, f"{stack.side}_aggregation") != "none"
            pre_norm = getattr(args, f"{stack.side}_normalize_before")
            normalise = args.aggregation_layer_norm == "on" and aggregates
            routed = getattr(args, f"{stack.side}_aggregation") in ROUTING_CHOICES
            stack.set_aggregator(aggregator, args.aggregate_embedding, normalise_layers=normalise and pre_norm,
                                 normalise_aggregate=normalise and routed and not pre_norm,
                                 ramp_updates=args.aggregation_ramp_updates if aggregates else 0)
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
    args.routing_init = getattr(args, "routing_init", "random")
    args.aggregation_ramp_updates = getattr(args, "aggregation_ramp_updates", 0)
    args.aggregation_layer_norm = getattr(args, "aggregation_layer_norm", "on")
    base_architecture(args)


def validate_stack_flags(args) -> None:
    """Raises :class:`AggregationConfigError` for a ramp or per-layer norm that has nothing to act on."""
    sides = [side for side in ("encoder", "decoder") if getattr(args, f"{side}_aggregation") != "none"]
    ramp = args.aggregation_ramp_updates
    if ramp is None or ramp < 0:
        raise AggregationConfigError(
            f"--aggregation-ramp-updates: got {ramp}; it must be an integer >= 0 (0: no ramp)")
    if ramp > 0 and not sides:
        raise AggregationConfigError(
            f"--aggregation-ramp-updates {ramp}: neither side aggregates; set --encoder-aggregation or "
            f"--decoder-aggregation to one of {', '.join(AGGREGATION_CHOICES[1:])}")
    if args.aggregation_layer_norm not in SWITCH_CHOICES:
        raise AggregationConfigError(
            f"--aggregation-layer-norm: got {args.aggregation_layer_norm!r}; choose one of {', '.join(SWITCH_CHOICES)}")
