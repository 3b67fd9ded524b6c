"""What the aggregating encoder and decoder share: holding an aggregator and its warm start."""

from typing import Dict, List, Optional

from fairseq.modules import LayerNorm
from torch import Tensor, nn

from ..aggregators import AggregationRamp, LayerAggregator, TopLayer
from .warm_start import fill_missing_keys

#: Submodules that a vanilla Transformer checkpoint lacks; filled with their initial values on load.
AGGREGATION_MODULES = ("aggregator", "layer_norms", "aggregate_norm", "aggregation_ramp")
#: The normalisations of ``--aggregation-layer-norm``, absent from checkpoints saved before it.
NORMALISATIONS = ("layer_norms", "aggregate_norm")


class AggregatingStack(nn.Module):
    """Mixin for a fairseq layer stack whose output is an aggregate of its layers.

    The aggregator starts as :class:`TopLayer` (the vanilla stack); the model
    installs the configured one with :meth:`set_aggregator`, optionally with
    a LayerNorm on each aggregated layer (``--aggregation-layer-norm``, pre-norm
    sides, whose layers are raw residual streams that grow with depth), a
    LayerNorm on a routed aggregate (the same flag, post-norm sides, which have
    no final LayerNorm to bring the squashed or activation-scaled capsules to
    the Transformer's scale) and a ramp from H^L to the aggregate
    (``--aggregation-ramp-updates``).
    """

    side = ""

    def init_aggregator(self, embed_dim: int, num_layers: int) -> None:
        self.aggregate_embedding = False
        self.aggregator: LayerAggregator = TopLayer(embed_dim, num_layers)
        self.layer_norms: Optional[nn.ModuleList] = None
        self.aggregate_norm: Optional[nn.Module] = None
        self.aggregation_ramp: Optional[AggregationRamp] = None

    def set_aggregator(self, aggregator: LayerAggregator, aggregate_embedding: bool,
                       normalise_layers: bool = False, normalise_aggregate: bool = False,
                       ramp_updates: int = 0) -> None:
        aggregator.side = self.side
        self.aggregator = aggregator
        self.aggregate_embedding = aggregate_embedding
        if normalise_layers:
            self.layer_norms = nn.ModuleList(LayerNorm(aggregator.embed_dim) for _ in range(aggregator.num_layers))
        if normalise_aggregate:
            self.aggregate_norm = LayerNorm(aggregator.embed_dim)
        if ramp_updates > 0:
            self.aggregation_ramp = AggregationRamp(ramp_updates)

    @property
    def aggregates(self) -> bool:
        return not isinstance(self.aggregator, TopLayer)

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
