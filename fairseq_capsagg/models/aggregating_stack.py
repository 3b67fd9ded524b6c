"""What the aggregating encoder and decoder share: their aggregation, its flags and its warm start."""

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Type

from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..aggregators import (AggregationConfigError, AggregationRamp, LayerAggregator, Settings, aggregation_choices,
                           aggregator_class, dense_connection_class, make_aggregator, make_dense_connections, setting,
                           settings_classes, validated_settings)
from ..aggregators.settings import distinct_fields, flag_name
from .dense_connections import DenseConnections, ResidualStreams
from .warm_start import fill_missing_keys

logger = logging.getLogger(__name__)

#: Submodules that a vanilla Transformer checkpoint lacks; filled with their initial values on load.
AGGREGATION_MODULES = ("aggregator", "layer_norms", "aggregate_norm", "aggregation_ramp", "dense_connections")
#: The normalisations of ``--aggregation-layer-norm``, absent from checkpoints saved before it.
NORMALISATIONS = ("layer_norms", "aggregate_norm")
SIDES = ("encoder", "decoder")


@dataclass
class StackSettings(Settings):
    """Flags of the aggregating stacks, whatever their aggregator."""

    aggregate_embedding: bool = setting(False, "also aggregate the embedding layer output H^0 (off in the paper)")
    aggregation_ramp_updates: int = setting(
        0, "start from H^L and ramp the aggregate in: H~ = (1 - a) H^L + a Omega, a = t/K over the first K "
           "updates of the run (0: no ramp)", metavar="K")
    aggregation_layer_norm: str = setting(
        "on", "pre-norm sides: a LayerNorm on each aggregated layer before the aggregator, as the raw residual "
              "streams grow with depth; post-norm sides: a LayerNorm on a routed aggregate", choices=("on", "off"))

    def validate(self, aggregating_sides: List[str]) -> None:
        """Raises :class:`AggregationConfigError` for a ramp that is negative or has nothing to act on."""
        self.check_choices()
        ramp = self.aggregation_ramp_updates
        self.require("aggregation_ramp_updates", ramp >= 0, "it must be an integer >= 0 (0: no ramp)")
        if ramp > 0 and not aggregating_sides:
            raise AggregationConfigError(
                f"--aggregation-ramp-updates {ramp}: neither side aggregates; set --encoder-aggregation or "
                f"--decoder-aggregation to one of "
                f"{', '.join(name for name in aggregation_choices() if name != 'none')}")


class Placement(NamedTuple):
    """One aggregator that a side uses: at the stack's output or between its blocks, its settings checked."""

    side: str
    between_blocks: bool  # --{side}-dense-connections; else --{side}-aggregation, at the stack's output
    name: str
    cls: Type[LayerAggregator]
    settings: Settings

    @property
    def flag(self) -> str:
        return f"--{self.side}-dense-connections" if self.between_blocks else f"--{self.side}-aggregation"


def keeps_streams(cls: Type[LayerAggregator]) -> bool:
    """Whether a between-blocks connection keeps residual streams (hyper-connections) rather than reading a
    history of block outputs."""
    return getattr(cls, "keeps_streams", False)


class SideAggregation(NamedTuple):
    """Everything a side's aggregation is built from, read from the model's arguments and checked once
    (:meth:`AggregationPlan.from_args`) before any module is built."""

    side: str
    embed_dim: int
    num_blocks: int
    normalize_before: bool
    stack: StackSettings
    output: Optional[Placement]  # --{side}-aggregation, None for none
    dense: Optional[Placement]  # --{side}-dense-connections, None for none

    @property
    def num_aggregated(self) -> int:
        """L, the layer outputs the output aggregator reads (the embedding's too with --aggregate-embedding)."""
        return self.num_blocks + (1 if self.stack.aggregate_embedding else 0)

    def describe(self) -> str:
        """``SIDE: NAME`` and its dense connections, for messages."""
        output = self.output.name if self.output else "none"
        return f"{self.side}: {output}" + (f" (dense connections: {self.dense.name})" if self.dense else "")


def _placement(values: Dict[str, Any], side: str, between_blocks: bool, embed_dim: int) -> Optional[Placement]:
    """The aggregator of one flag, its class looked up and its settings checked; errors name the flag."""
    flag = f"--{side}-dense-connections" if between_blocks else f"--{side}-aggregation"
    name = values.get(f"{side}_dense_connections" if between_blocks else f"{side}_aggregation") or "none"
    if name == "none":
        return None
    try:
        cls = dense_connection_class(name) if between_blocks else aggregator_class(name)
    except AggregationConfigError as e:
        raise AggregationConfigError(f"{flag}: {e}") from None
    settings = validated_settings(cls, cls.Settings.from_values(values), embed_dim)
    return Placement(side, between_blocks, name, cls, settings)


def _check_output_depth(plan: SideAggregation) -> None:
    """The output aggregator has at least the layer outputs its routing or weighting needs."""
    try:
        plan.output.cls.check_num_layers(plan.num_aggregated)
    except AggregationConfigError:
        raise AggregationConfigError(
            f"{plan.output.flag} {plan.output.name}: needs at least 2 layer outputs to aggregate, got "
            f"{plan.num_aggregated}; use more --{plan.side}-layers, --aggregate-embedding, or 'none'") from None


def _check_every_layer_runs(values: Dict[str, Any], chosen: Placement) -> None:
    """No layer is skipped (LayerDrop) and, for connections between blocks, none recomputed (their hooks would
    not replay)."""
    if values.get(f"{chosen.side}_layerdrop", 0) > 0:
        needs = ("every block reads the outputs of all earlier blocks" if chosen.between_blocks
                 else "the aggregator needs every layer's output")
        raise AggregationConfigError(f"--{chosen.side}-layerdrop must be 0 with {chosen.flag} {chosen.name}: {needs}")
    if chosen.between_blocks and (values.get("checkpoint_activations") or values.get("offload_activations")):
        raise AggregationConfigError(
            f"--checkpoint-activations cannot be combined with {chosen.flag} {chosen.name}: "
            "the connections run as hooks that a recomputed block would not replay")


def _check_dense(values: Dict[str, Any], plan: SideAggregation) -> None:
    """Residual streams need pre-norm blocks and an optimizer that can exempt their static weights from weight
    decay; multiway connections need the block's own query, key and value."""
    dense = plan.dense
    if keeps_streams(dense.cls):
        if not plan.normalize_before:
            raise AggregationConfigError(
                f"{dense.flag} {dense.name}: its residual streams replace the residual connections of "
                f"pre-norm blocks; add --{plan.side}-normalize-before (its transformer_{dense.cls.family}_* "
                "architectures are pre-norm at every shape)")
        half = (values.get("fp16") or values.get("bf16")) and not values.get("amp")
        if values.get("weight_decay", 0) > 0 and half:
            raise AggregationConfigError(
                f"--weight-decay {values['weight_decay']} with {dense.flag} {dense.name} and --fp16/--bf16: "
                "fairseq's half-precision optimizer cannot exempt the static stream weights from weight decay; "
                "use --amp, or --weight-decay 0")
    if dense.cls.multiway and values.get("cross_self_attention"):
        raise AggregationConfigError(
            f"{dense.flag} {dense.name}: feeds the query, key and value of a block's self-attention, "
            "which --cross-self-attention replaces")


def read_side(args: Any, side: str, stack: StackSettings) -> SideAggregation:
    """Reads and checks the aggregation of ``side`` from fairseq's arguments: the one place that reads
    a side's flags.

    Raises:
        AggregationConfigError: one line naming the flag and its allowed values.
    """
    values = vars(args)
    embed_dim, num_blocks = values[f"{side}_embed_dim"], values[f"{side}_layers"]
    plan = SideAggregation(side, embed_dim, num_blocks, bool(values[f"{side}_normalize_before"]), stack,
                           _placement(values, side, False, embed_dim), _placement(values, side, True, embed_dim))
    if plan.output is not None:
        _check_output_depth(plan)
    for chosen in (c for c in (plan.output, plan.dense) if c is not None):
        _check_every_layer_runs(values, chosen)
    if plan.dense is not None:
        _check_dense(values, plan)
    return plan


class AggregationPlan(NamedTuple):
    """Both sides' aggregation, read from a model's arguments and checked before anything is built."""

    encoder: SideAggregation
    decoder: SideAggregation

    @classmethod
    def from_args(cls, args: Any) -> "AggregationPlan":
        """Reads every aggregation flag once and warns about settings that no chosen aggregator reads.

        Raises:
            AggregationConfigError: one line naming the flag and its allowed values.
        """
        stack = StackSettings.from_values(vars(args))
        plan = cls(*(read_side(args, side, stack) for side in SIDES))
        stack.validate([side.side for side in plan if side.output is not None])
        ignored = plan.ignored_settings(vars(args))
        if ignored:
            logger.warning("%s: no chosen aggregator reads %s; ignored",
                           ", ".join(side.describe() for side in plan), ", ".join(ignored))
        return plan

    def placements(self) -> List[Placement]:
        return [p for side in self for p in (side.output, side.dense) if p is not None]

    def ignored_settings(self, values: Dict[str, Any]) -> List[str]:
        """``--flag value`` for every aggregator setting away from its default that no chosen aggregator reads.

        Such a setting is not an error: one set of flags may serve several systems (the main job's
        ``--model-args``), and a model without aggregation keeps the flags of the one it is compared with.
        """
        read = {f.name for placement in self.placements() for f in placement.cls.Settings.fields()}
        return [f"{flag_name(f.name)} {values[f.name]}" for f in distinct_fields(settings_classes())
                if f.name not in read and values.get(f.name) is not None and values[f.name] != f.default]


class AggregatingStack(nn.Module):
    """Mixin for a fairseq layer stack whose output is an aggregate of its layers.

    A stack starts without aggregation (the vanilla stack); the model installs the configured
    aggregator with :meth:`build_aggregation` once the stack's layers exist, optionally with a
    LayerNorm on each aggregated layer (``--aggregation-layer-norm``, pre-norm sides, whose
    layers are raw residual streams that grow with depth), a LayerNorm on a routed aggregate
    (the same flag, post-norm sides, which have no final LayerNorm to bring the squashed or
    activation-scaled capsules to the Transformer's scale) and a ramp from H^L to the aggregate
    (``--aggregation-ramp-updates``).
    """

    side = ""

    def init_aggregation(self) -> None:
        self.dense_connections: Optional[DenseConnections] = None
        self.aggregator: Optional[LayerAggregator] = None
        self.aggregate_embedding = False
        self.layer_norms: Optional[nn.ModuleList] = None
        self.aggregate_norm: Optional[nn.Module] = None
        self.aggregation_ramp: Optional[AggregationRamp] = None

    def build_aggregation(self, plan: SideAggregation) -> None:
        """Installs this side's dense connections and output aggregator (``plan``: checked already)."""
        if plan.dense is not None:
            connections = make_dense_connections(plan.dense.cls, plan.embed_dim, len(self.layers), plan.dense.settings,
                                                 plan.side)
            self.dense_connections = (ResidualStreams(connections, self.layers) if keeps_streams(plan.dense.cls)
                                      else DenseConnections(connections, self.layers, plan.normalize_before))
        if plan.output is None:
            return
        output, stack = plan.output, plan.stack
        self.aggregator = make_aggregator(output.cls, plan.embed_dim, plan.num_aggregated, output.settings, plan.side)
        self.aggregate_embedding = stack.aggregate_embedding
        normalise = stack.aggregation_layer_norm == "on"
        if normalise and plan.normalize_before:
            self.layer_norms = nn.ModuleList(LayerNorm(plan.embed_dim) for _ in range(plan.num_aggregated))
        elif normalise and self.aggregator.scaled_output:
            self.aggregate_norm = LayerNorm(plan.embed_dim)
        if stack.aggregation_ramp_updates > 0:
            self.aggregation_ramp = AggregationRamp(stack.aggregation_ramp_updates)

    @property
    def aggregates(self) -> bool:
        return self.aggregator is not None

    def aggregate(self, states: List[Tensor], padding_mask: Optional[Tensor]) -> Tensor:
        """H~ from the collected states (embedding output first) at every position."""
        layers = states if self.aggregate_embedding else states[1:]
        top = layers[-1]
        if self.layer_norms is not None:
            layers = [norm(layer) for norm, layer in zip(self.layer_norms, layers)]
        out = self.aggregator(layers, padding_mask)
        if self.aggregate_norm is not None:
            out = self.aggregate_norm(out)
        if self.aggregation_ramp is not None:
            out = self.aggregation_ramp(top, out)  # the raw H^L: at a_t = 0 exactly the plain stack
        return out

    def fill_aggregator_keys(self, state_dict: Dict[str, Tensor], name: str) -> Dict[str, Tensor]:
        """Lets a checkpoint without aggregation weights (a vanilla Transformer) load strictly.

        An aggregator trained without the LayerNorms of ``--aggregation-layer-norm`` (a
        checkpoint from before that flag) is loaded without them, so it computes what it was
        trained to.
        """
        prefix = f"{name}." if name else ""
        has = {module: any(key.startswith(f"{prefix}{module}.") for key in state_dict)
               for module in AGGREGATION_MODULES}
        if has["aggregator"] and not any(has[module] for module in NORMALISATIONS):
            self.layer_norms = self.aggregate_norm = None
        for module_name in AGGREGATION_MODULES:
            module = getattr(self, module_name)
            if module is not None:
                prefix = f"{name}.{module_name}" if name else module_name
                state_dict = fill_missing_keys(module, state_dict, prefix)
        return state_dict
