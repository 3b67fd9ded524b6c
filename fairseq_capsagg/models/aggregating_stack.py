"""What the aggregating encoder and decoder share: their aggregation, its flags and its warm start."""

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Type

from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..aggregators import (
    AggregationConfigError,
    AggregationRamp,
    LayerAggregator,
    Settings,
    aggregation_choices,
    aggregator_class,
    build_aggregator,
    build_dense_connections,
    dense_connection_class,
    setting,
    settings_classes,
    validate_settings,
)
from ..aggregators.settings import distinct_fields, flag_name
from .dense_connections import DenseConnections
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
                f"--decoder-aggregation to one of {', '.join(name for name in aggregation_choices() if name != 'none')}")


def aggregating_sides(args: Any) -> List[str]:
    return [side for side in SIDES if getattr(args, f"{side}_aggregation") != "none"]


class ChosenAggregator(NamedTuple):
    """One aggregator that a model's arguments choose: its side, its place and its class."""

    side: str
    between_blocks: bool  # --{side}-dense-connections; else --{side}-aggregation, at the stack's output
    name: str
    cls: Type[LayerAggregator]

    @property
    def flag(self) -> str:
        return f"--{self.side}-dense-connections" if self.between_blocks else f"--{self.side}-aggregation"


def chosen_aggregators(args: Any) -> List[ChosenAggregator]:
    """The aggregators at each side's output and between its blocks; an unknown name names its flag."""
    chosen = [ChosenAggregator(side, False, getattr(args, f"{side}_aggregation"),
                               aggregator_class(getattr(args, f"{side}_aggregation"), side))
              for side in aggregating_sides(args)]
    for side in SIDES:
        name = getattr(args, f"{side}_dense_connections", "none")
        if name != "none":
            chosen.append(ChosenAggregator(side, True, name, dense_connection_class(name, side)))
    return chosen


def ignored_settings(args: Any) -> List[str]:
    """``--flag value`` for every aggregator setting away from its default that no chosen aggregator reads.

    Such a setting is not an error: one set of flags may serve several systems (the main job's
    ``--model-args``), and a model without aggregation keeps the flags of the one it is compared with.
    """
    read = {f.name for chosen in chosen_aggregators(args) for f in chosen.cls.Settings.fields()}
    ignored = []
    for f in distinct_fields(settings_classes()):
        value = getattr(args, f.name, None)
        if f.name not in read and value is not None and value != f.default:
            ignored.append(f"{flag_name(f.name)} {value}")
    return ignored


def describe_aggregation(args: Any) -> str:
    """``encoder: NAME, decoder: NAME`` with each side's dense connections, for messages."""
    parts = []
    for side in SIDES:
        dense = getattr(args, f"{side}_dense_connections", "none")
        parts.append(f"{side}: {getattr(args, f'{side}_aggregation')}"
                     + (f" (dense connections: {dense})" if dense != "none" else ""))
    return ", ".join(parts)


def validate_aggregation(args: Any) -> None:
    """Checks every aggregation flag of a model's arguments before anything is built, and warns
    about settings that no chosen aggregator reads.

    Raises:
        AggregationConfigError: one line naming the flag and its allowed values.
    """
    StackSettings.from_namespace(args).validate(aggregating_sides(args))
    for chosen in chosen_aggregators(args):
        validate_settings(chosen.name, args, getattr(args, f"{chosen.side}_embed_dim"), chosen.side, chosen.cls)
        if getattr(args, f"{chosen.side}_layerdrop") > 0:
            needs = ("every block reads the outputs of all earlier blocks" if chosen.between_blocks
                     else "the aggregator needs every layer's output")
            raise AggregationConfigError(f"--{chosen.side}-layerdrop must be 0 with {chosen.flag} {chosen.name}: {needs}")
        recomputed = getattr(args, "checkpoint_activations", False) or getattr(args, "offload_activations", False)
        if chosen.between_blocks and recomputed:
            raise AggregationConfigError(
                f"--checkpoint-activations cannot be combined with {chosen.flag} {chosen.name}: "
                "the connections run as hooks that a recomputed block would not replay")
    ignored = ignored_settings(args)
    if ignored:
        logger.warning("%s: no chosen aggregator reads %s; ignored", describe_aggregation(args), ", ".join(ignored))


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

    def build_aggregation(self, args: Any) -> None:
        """Installs ``--{side}-dense-connections`` and ``--{side}-aggregation`` over the layers this
        stack has (flags validated)."""
        embed_dim = getattr(args, f"{self.side}_embed_dim")
        dense = getattr(args, f"{self.side}_dense_connections")
        if dense != "none":
            connections = build_dense_connections(dense, embed_dim, len(self.layers), args, self.side)
            self.dense_connections = DenseConnections(
                connections, self.layers, getattr(args, f"{self.side}_normalize_before"))
        name = getattr(args, f"{self.side}_aggregation")
        if name == "none":
            return
        stack = StackSettings.from_namespace(args)
        num_layers = len(self.layers) + (1 if stack.aggregate_embedding else 0)
        self.aggregator = build_aggregator(name, embed_dim, num_layers, args, self.side)
        self.aggregate_embedding = stack.aggregate_embedding
        normalise = stack.aggregation_layer_norm == "on"
        if normalise and getattr(args, f"{self.side}_normalize_before"):
            self.layer_norms = nn.ModuleList(LayerNorm(embed_dim) for _ in range(num_layers))
        elif normalise and self.aggregator.scaled_output:
            self.aggregate_norm = LayerNorm(embed_dim)
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
        has = {module: any(key.startswith(f"{prefix}{module}.") for key in state_dict) for module in AGGREGATION_MODULES}
        if has["aggregator"] and not any(has[module] for module in NORMALISATIONS):
            self.layer_norms = self.aggregate_norm = None
        for module_name in AGGREGATION_MODULES:
            module = getattr(self, module_name)
            if module is not None:
                prefix = f"{name}.{module_name}" if name else module_name
                state_dict = fill_missing_keys(module, state_dict, prefix)
        return state_dict
