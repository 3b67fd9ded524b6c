"""The interface every layer aggregator implements."""

import contextlib
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple, Type, Union

import torch
from torch import Tensor, nn

from .settings import AggregationConfigError, Settings


class NonFiniteAggregationError(FloatingPointError):
    """An aggregator turned finite layer outputs into NaN or inf; the message names where."""


_cpu_checks = [True]


def checks_finite(tensor: Tensor) -> bool:
    """Whether training checks that an aggregate of ``tensor``'s device is finite: on the CPU always (outside
    :func:`gpu_checks_only`); on a GPU only under ``torch.autograd.set_detect_anomaly`` (the check reads the
    GPU's result, so it would wait for every connection of every block; fairseq's loss scaler and its NaN check
    on the gradient norm still see a non-finite step)."""
    return (_cpu_checks[-1] and tensor.device.type == "cpu") or torch.is_anomaly_enabled()


@contextlib.contextmanager
def gpu_checks_only() -> Iterator[None]:
    """Within it the CPU checks only what a GPU checks, so that a CPU runs a GPU's operators (the benchmarks'
    kernel counts)."""
    _cpu_checks.append(False)
    try:
        yield
    finally:
        _cpu_checks.pop()


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
    #: Where it can aggregate: ``output`` (the stack's output, ``--{side}-aggregation``) and, for
    #: aggregators that start as the identity and are cheap enough to run after every block,
    #: ``between-blocks`` (``--{side}-dense-connections``).
    placements: ClassVar[Tuple[str, ...]] = ("output",)
    #: The placement of its ``transformer_{family}_{shape}`` architectures.
    architecture_placement: ClassVar[str] = "output"
    #: Settings its architectures give other values than the flags' defaults (a flag shared with another family
    #: keeps one default; the command line still overrides them).
    architecture_settings: ClassVar[Dict[str, Any]] = {}
    #: :meth:`aggregate` reads the layers stacked depth first, (L, T, B, C): a weighted sum over
    #: depth is then one contiguous reduction (about 2.5x faster on CPU than over (T, B, L, C)).
    depth_first: ClassVar[bool] = False
    #: Between blocks, it feeds the next block's self-attention query, key and value separately
    #: (:attr:`streams` > 1), so that block must attend to itself.
    multiway: ClassVar[bool] = False
    #: A fresh one computes exactly what the Transformer without it computes (with
    #: :attr:`warm_start_flags` where it has them); False for one its paper starts elsewhere (DLCL's
    #: uniform average).
    starts_as_transformer: ClassVar[bool] = True

    def __init__(self, embed_dim: int, num_layers: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_layers = num_layers
        self.streams = 1  # outputs per position: more for multiway connections between blocks
        self.side = ""  # "encoder" or "decoder", set by build_aggregator, for error messages

    @classmethod
    def validate(cls, settings: Settings, embed_dim: int, side: str = "") -> None:
        """Raises :class:`AggregationConfigError` for settings that cannot work at width d.

        The base class checks every setting's choices; subclasses add their ranges.
        """
        settings.check_choices()

    @classmethod
    def check_num_layers(cls, num_layers: int) -> None:
        """Raises :class:`AggregationConfigError` when there is nothing to aggregate."""
        if num_layers < 2:
            raise AggregationConfigError(f"{cls.name}: needs at least 2 layer outputs to aggregate, got {num_layers}")

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: Settings) -> "LayerAggregator":
        """The aggregator for L = ``num_layers`` outputs of width d (settings already validated)."""
        return cls(embed_dim, num_layers)

    @classmethod
    def between_blocks(cls, embed_dim: int, num_layers: int, settings: Settings,
                       last: bool) -> "LayerAggregator":
        """The connection after one block of a densely connected stack, over its L = ``num_layers``
        earlier outputs (the embedding first); ``last``: after the stack's top block."""
        return cls.from_settings(embed_dim, num_layers, settings)

    @classmethod
    def connect_blocks(cls, embed_dim: int, num_blocks: int, settings: Settings) -> List["LayerAggregator"]:
        """The connections of a densely connected stack of ``num_blocks`` blocks: the i-th (from 0), after
        block i + 1, over the embedding and the i + 1 block outputs so far (:meth:`between_blocks`)."""
        return [cls.between_blocks(embed_dim, block + 2, settings, last=block == num_blocks - 1)
                for block in range(num_blocks)]

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: Settings) -> float:
        """Multiply-adds of one forward pass at one position (the benchmarks' FLOP bound)."""
        raise NotImplementedError(f"{cls.__name__} must declare its multiply-adds per position")

    @classmethod
    def between_blocks_multiply_adds(cls, embed_dim: int, num_blocks: int, settings: Settings) -> float:
        """Multiply-adds per position of the connections after each of ``num_blocks`` blocks."""
        return sum(cls.multiply_adds(embed_dim, block + 2, settings) for block in range(num_blocks))

    def forward(self, layers: Union[List[Tensor], Tensor], padding_mask: Optional[Tensor] = None) -> Tensor:
        """Aggregates the layers.

        Args:
            layers: L tensors of shape (T, B, C), bottom layer first, or those already stacked as :meth:`stack`
                stacks them (the dense connections between blocks hold them so,
                :class:`~fairseq_capsagg.aggregators.layer_history.LayerHistory`).
            padding_mask: (B, T), True at padded positions, or None.

        Returns:
            (T, B, C): the aggregated representation, zero at padded positions; with
            :attr:`streams` S > 1, (S, T, B, C): one aggregate per input stream of the next block.
        """
        stacked = self.stack(layers)
        if stacked.size(self.stack_dim) != self.num_layers:
            raise ValueError(
                f"{type(self).__name__} was built for {self.num_layers} layers but got "
                f"{stacked.size(self.stack_dim)}; layer dropping (layerdrop) cannot be combined with layer aggregation"
            )
        out = self.aggregate(stacked, padding_mask)
        if padding_mask is not None:
            out = out.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        if self.training and checks_finite(out) and not torch.isfinite(out).all() and torch.isfinite(stacked).all():
            # non-finite inputs (an fp16 overflow upstream) are left to fairseq's loss scaler
            raise NonFiniteAggregationError(self.describe_fault(stacked, padding_mask))
        return out

    @property
    def stack_dim(self) -> int:
        """Where :meth:`stack` puts depth."""
        return 0 if self.depth_first else 2

    def stack_input(self, index: int, layer: Tensor) -> Tensor:
        """What :meth:`stack` holds of the layer output at depth ``index`` (from 0): the output itself; a
        subclass may transform it first (DLCL normalises it)."""
        return layer

    def stack(self, layers: Union[List[Tensor], Tensor]) -> Tensor:
        """The layers as :meth:`aggregate` reads them: (T, B, L, C), or (L, T, B, C) if :attr:`depth_first`;
        layers given stacked, as they are."""
        if isinstance(layers, Tensor):
            return layers
        return torch.stack([self.stack_input(index, layer) for index, layer in enumerate(layers)], dim=self.stack_dim)

    def describe_fault(self, layers: Tensor, padding_mask: Optional[Tensor]) -> str:
        """Says where a non-finite output came from (called only when one did)."""
        return (f"{self.side or 'the'} aggregator {type(self).__name__} produced NaN/inf "
                "from finite layer outputs")

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        """Maps stacked layers (T, B, L, C), or (L, T, B, C) if :attr:`depth_first`, to (T, B, C)
        (or (S, T, B, C), see :meth:`forward`)."""
        raise NotImplementedError
