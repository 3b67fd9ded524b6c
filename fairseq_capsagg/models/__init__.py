"""Models and architectures of the plugin."""

from .capsagg_transformer import CapsAggTransformerModel, capsagg_base_architecture
from .architectures import ARCHITECTURES, SHAPES, SMALL_SHAPE, shape_flags
from .decoder import CapsAggTransformerDecoder
from .encoder import CapsAggTransformerEncoder

__all__ = [
    "ARCHITECTURES",
    "CapsAggTransformerDecoder",
    "CapsAggTransformerEncoder",
    "CapsAggTransformerModel",
    "SHAPES",
    "SMALL_SHAPE",
    "capsagg_base_architecture",
    "shape_flags",
]
