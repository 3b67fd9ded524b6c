"""Layer aggregators: combine the outputs H^1..H^L of a Transformer stack.

Needs only torch. Each aggregator is one module that registers its class
(:func:`register_aggregator`); importing it below makes it a value of
``--encoder-aggregation`` / ``--decoder-aggregation``, gives it its flags and, if it
declares a family, the ``transformer_{family}_{base,big,small}`` architectures. The order
of the imports is the order of the choices.
"""

from .base import LayerAggregator, NonFiniteAggregationError
from .initialisation import xavier_uniform_per_matrix_
from .ramp import AggregationRamp
from .registry import (
    AGGREGATORS,
    aggregation_choices,
    aggregator_class,
    build_aggregator,
    build_dense_connections,
    dense_connection_choices,
    dense_connection_class,
    families,
    family_class,
    register_aggregator,
    make_aggregator,
    make_dense_connections,
    settings_classes,
    validated_settings,
)
from .settings import AggregationConfigError, Settings, setting

# the aggregators, in the order of the choices
from .top_layer import TopLayer
from .linear_combination import LinearCombination
from .dynamic_combination import DynamicCombination
from .capsules import CapsuleRouting, RoutingSettings, squash
from .dynamic_routing import DynamicRouting
from .em_routing import EMRouting
from .depth_weighted_average import DepthWeightedAverage
from .depth_attention import DepthAttention, DepthAttentionSettings
from .mudd import MULTIWAY_STREAMS, MUDDSettings, MultiwayDynamicDense
from .dlcl import DynamicLinearCombination
from .streams import StreamConnection, StreamSettings
from .hyper_connections import HyperConnections
from .mhc import ManifoldHyperConnections
from .sinkhorn import sinkhorn

__all__ = [
    "AGGREGATORS",
    "AggregationConfigError",
    "AggregationRamp",
    "CapsuleRouting",
    "DepthAttention",
    "DepthAttentionSettings",
    "DepthWeightedAverage",
    "DynamicLinearCombination",
    "HyperConnections",
    "ManifoldHyperConnections",
    "StreamConnection",
    "StreamSettings",
    "DynamicCombination",
    "DynamicRouting",
    "EMRouting",
    "LayerAggregator",
    "LinearCombination",
    "MULTIWAY_STREAMS",
    "MUDDSettings",
    "MultiwayDynamicDense",
    "NonFiniteAggregationError",
    "RoutingSettings",
    "Settings",
    "TopLayer",
    "aggregation_choices",
    "aggregator_class",
    "build_aggregator",
    "build_dense_connections",
    "dense_connection_choices",
    "dense_connection_class",
    "families",
    "family_class",
    "make_aggregator",
    "make_dense_connections",
    "register_aggregator",
    "setting",
    "sinkhorn",
    "settings_classes",
    "squash",
    "validated_settings",
    "xavier_uniform_per_matrix_",
]
