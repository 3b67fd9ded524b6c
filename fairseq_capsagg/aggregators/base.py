"""The interface every layer aggregator implements."""

from typing import ClassVar, List, Optional, Tuple, Type

import torch
from torch import Tensor, nn

from .settings import AggregationConfigError, Settings


class NonFiniteAggregationError(FloatingPointError):
    """An aggregator turned finite layer outputs into NaN or inf; the message names where."""


class LayerAggregator(nn.Module):
    """Combines the L layer outputs H^1..H^L of a stack into one representation.

    Subclasses implement :meth:`aggregate` on the stacked layers. Every
    aggregator of this package works per position: the output at one
    position reads only that position's layer outputs, so padding, batching
    and incremental decoding cannot change it.

    A subclass registered with :func:`~fairseq_capsagg.aggregators.registry.register_aggregator`
    declares what the rest of the plugin derives from it: its :attr:`name` (the value of
    ``--encoder-aggregation``), its :attr:`family` (the ``transformer_{family}_{shape}``
    architectures and the main job's system), its :attr:`label` in tables, its
    :attr:`Settings` (one dataclass whose fields are its flags), its validation
    (:meth:`validate`) and its construction (:meth:`from_settings`).

    Args:
        embed_dim: d, the width of each layer output.
        num_layers: L, how many layer outputs :meth:`forward` receives.
    """

    name: ClassVar[str]
    family: ClassVar[str] = ""  # "": no architectures of its own
    label: ClassVar[str]
    Settings: ClassVar[Type[Settings]] = Settings
    #: The output is not at the layers' scale (squashed or activation-scaled capsules), so a
    #: post-norm side, which has no final LayerNorm, normalises it (``--aggregation-layer-norm``).
    scaled_output: ClassVar[bool] = False
    #: Flags under which a fresh aggregator starts as the Transformer it is added to (warm starts);
    #: empty when it always does, or never can.
    warm_start_flags: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, embed_dim: int, num_layers: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_layers = num_layers
        self.side = ""  # "encoder" or "decoder", set by build_aggregator, for error messages

    @classmethod
    def validate(cls, settings: Settings, embed_dim: int, side: str = "") -> None:
        """Raises :class:`AggregationConfigError` for settings that cannot work at width d.

        The base class checks every setting's choices; subclasses add their ranges.
        """
        settings.check_choices()

    @classmethod
    def check_num_layers(cls, num_layers: int, side: str = "") -> None:
        """Raises :class:`AggregationConfigError` when there is nothing to aggregate."""
        if num_layers < 2:
            flag = f"--{side}-aggregation" if side else "aggregation"
            raise AggregationConfigError(
                f"{flag} {cls.name}: needs at least 2 layer outputs to aggregate, "
                f"got {num_layers}; use more --{side or 'encoder'}-layers, --aggregate-embedding, or 'none'"
            )

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: Settings) -> "LayerAggregator":
        """The aggregator for L = ``num_layers`` outputs of width d (settings already validated)."""
        return cls(embed_dim, num_layers)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: Settings) -> float:
        """Multiply-adds of one forward pass at one position (the benchmarks' FLOP bound)."""
        raise NotImplementedError(f"{cls.__name__} must declare its multiply-adds per position")

    def forward(self, layers: List[Tensor], padding_mask: Optional[Tensor] = None) -> Tensor:
        """Aggregates the layers.

        Args:
            layers: L tensors of shape (T, B, C), bottom layer first.
            padding_mask: (B, T), True at padded positions, or None.

        Returns:
            (T, B, C): the aggregated representation, zero at padded positions.
        """
        if len(layers) != self.num_layers:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_layers} layers but got "
                f"{len(layers)}; layer dropping (--encoder-layerdrop/--decoder-layerdrop) "
                "cannot be combined with layer aggregation"
            )
        stacked = torch.stack(layers, dim=2)
        out = self.aggregate(stacked, padding_mask)
        if padding_mask is not None:
            out = out.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        if self.training and not torch.isfinite(out).all() and torch.isfinite(stacked).all():
            # non-finite inputs (an fp16 overflow upstream) are left to fairseq's loss scaler
            raise NonFiniteAggregationError(self.describe_fault(stacked, padding_mask))
        return out

    def describe_fault(self, layers: Tensor, padding_mask: Optional[Tensor]) -> str:
        """Says where a non-finite output came from (called only when one did)."""
        return (f"{self.side or 'the'} aggregator {type(self).__name__} produced NaN/inf "
                "from finite layer outputs")

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Maps stacked layers (T, B, L, C) to (T, B, C)."""
        raise NotImplementedError
