"""Layer aggregators: combine the outputs H^1..H^L of a Transformer stack."""

from typing import Optional

from .base import LayerAggregator, NonFiniteAggregationError
from .capsules import CapsuleRouting, squash
from .config import (
    AGGREGATION_CHOICES,
    CAPSULE_INPUT_CHOICES,
    LINEAR_WEIGHT_CHOICES,
    ROUTING_CHOICES,
    ROUTING_INIT_CHOICES,
    AggregationConfig,
    AggregationConfigError,
)
from .dynamic_combination import DynamicCombination
from .dynamic_routing import DynamicRouting
from .em_routing import EMRouting
from .initialisation import xavier_uniform_per_matrix_
from .linear_combination import LinearCombination
from .ramp import AggregationRamp
from .top_layer import TopLayer


def build_aggregator(
    name: str,
    embed_dim: int,
    num_layers: int,
    cfg: Optional[AggregationConfig] = None,
    side: str = "",
) -> LayerAggregator:
    """Builds the aggregator called ``name`` for L = ``num_layers`` outputs of width d.

    Args:
        name: one of :data:`AGGREGATION_CHOICES`.
        embed_dim: d.
        num_layers: L, the number of layer outputs passed to ``forward``.
        cfg: hyper-parameters; defaults when None.
        side: ``encoder`` or ``decoder``, only to name the flag in errors.

    Raises:
        AggregationConfigError: for an unknown name or impossible settings.
    """
    cfg = cfg if cfg is not None else AggregationConfig()
    cfg.validate(name, embed_dim, num_layers, side)
    if name == "none":
        return TopLayer(embed_dim, num_layers)
    if name == "linear":
        return LinearCombination(embed_dim, num_layers, cfg.linear_weights)
    if name == "dynamic":
        return DynamicCombination(embed_dim, num_layers, cfg.ffn_dim or embed_dim)
    routing_args = (embed_dim, num_layers, cfg.num_output_capsules(embed_dim), cfg.routing_iters,
                    cfg.capsule_input, cfg.capsule_rank, cfg.compile_routing, cfg.routing_init)
    if name == "dynamic-routing":
        return DynamicRouting(*routing_args)
    return EMRouting(*routing_args, inverse_temperature=cfg.em_inverse_temperature)


__all__ = [
    "AGGREGATION_CHOICES",
    "AggregationRamp",
    "CAPSULE_INPUT_CHOICES",
    "LINEAR_WEIGHT_CHOICES",
    "ROUTING_CHOICES",
    "ROUTING_INIT_CHOICES",
    "AggregationConfig",
    "AggregationConfigError",
    "CapsuleRouting",
    "DynamicCombination",
    "DynamicRouting",
    "EMRouting",
    "LayerAggregator",
    "LinearCombination",
    "NonFiniteAggregationError",
    "TopLayer",
    "build_aggregator",
    "squash",
    "xavier_uniform_per_matrix_",
]
