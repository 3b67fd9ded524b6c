"""Layer aggregators: combine the outputs H^1..H^L of a Transformer stack.

Needs only torch. Three rooms over a shared floor:

- ``methods/``: what each method computes, one ``nn.Module`` per family, each registering its class
  (:func:`register_aggregator`); importing it below makes it a value of ``--encoder-aggregation`` /
  ``--decoder-aggregation``, gives it its flags and, if it declares a family, the
  ``transformer_{family}_{base,big,small}`` architectures. The order of the imports is the order of the choices.
- ``ops/``: the operators that make a method fast, each an eager reference and a ``torch.library`` operator each
  way, named after what it computes (``ops/em_route.py``); ``ops/dispatch.py`` picks the implementation.
- ``kernels/``: each operator's Triton kernels under the operator's name (``kernels/em_route.py``), imported only
  where Triton runs; they import nothing above them but :mod:`.numerics`.

The floor: the aggregator base, its registry and settings, the layer history, the ramp and initialisation, and
:mod:`.numerics` (the constants and small functions the three rooms share).
"""

from .base import LayerAggregator, NonFiniteAggregationError
from .initialisation import xavier_uniform_per_matrix_
from .numerics import squash
from .ramp import AggregationRamp
from .registry import (AGGREGATORS, aggregation_choices, aggregator_class, architecture_defaults, build_aggregator,
                       build_dense_connections, dense_connection_choices, dense_connection_class, families,
                       family_class, make_aggregator, make_dense_connections, register_aggregator, settings_classes,
                       validated_settings)
from .settings import AggregationConfigError, Settings, setting

# the aggregators, in the order of the choices
from .methods.top_layer import TopLayer
from .methods.linear_combination import LinearCombination
from .methods.dynamic_combination import DynamicCombination
from .methods.capsules import CapsuleRouting, RoutingSettings
from .methods.dynamic_routing import DynamicRouting
from .methods.em_routing import EMRouting
from .methods.depth_weighted_average import DepthWeightedAverage
from .methods.depth_attention import DepthAttention, DepthAttentionSettings
from .methods.mudd import MULTIWAY_STREAMS, MUDDSettings, MultiwayDynamicDense
from .methods.dlcl import DynamicLinearCombination
from .methods.streams import StreamConnection, StreamSettings
from .methods.hyper_connections import HyperConnections
from .methods.mhc import ManifoldHyperConnections
from .ops.sinkhorn import sinkhorn

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
    "architecture_defaults",
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
