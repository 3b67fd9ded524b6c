"""What hyper-connections and mHC share: n residual streams between pre-norm blocks.

The hidden state of a stack becomes H in R^{n x d} per position (n copies of the embedding output at
the start). Before block l its input is read from the streams, h = sum_i a_i H_i; after it, with the
block's output y = h + F(h) (a pre-norm block adds its sublayers to its input), the streams become
H'_j = sum_i r_{ij} H_i + b_j F(h). Each connection here holds the weights (a, r, b) of one block; the top
block's also holds the stack's readout, the vector that turns H into the stack's state (what fairseq
records as each block's output and passes on, and the stack's output after the top block). The update is
computed as b_j y + (sum_i r_{ij} H_i - b_j h), so that with a one-hot, r = I and b = 1 the streams stay
exact copies of the Transformer's residual stream and the model computes exactly what the Transformer
computes.
"""

from dataclasses import dataclass
from typing import ClassVar, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..ops.stream_write import stream_write
from ..settings import KernelSettings, setting


@dataclass
class StreamSettings(KernelSettings):
    """The settings of every connection with residual streams."""

    residual_streams: int = setting(4, "hyper-connections, mHC: residual streams n per position (n-fold residual "
                                       "memory)", metavar="N")
    stream_weights: str = setting(
        "dynamic", "hyper-connections, mHC: static weights only, or static plus weights computed from the streams at "
                   "each position (dynamic, the papers')", choices=("static", "dynamic"))


class StreamConnection(LayerAggregator):
    """One block's connection to the residual streams (see the module docstring)."""

    Settings = StreamSettings
    placements: ClassVar[Tuple[str, ...]] = ("between-blocks",)
    architecture_placement = "between-blocks"
    #: A block's increment F(h) = y - h is the sum of its sublayers only in a pre-norm block.
    needs_pre_norm: ClassVar[bool] = True
    #: The connections keep the streams H instead of reading a history of block outputs.
    keeps_streams: ClassVar[bool] = True

    @classmethod
    def validate(cls, settings: StreamSettings, embed_dim: int, side: str = "") -> None:
        super().validate(settings, embed_dim, side)
        settings.require("residual_streams", settings.residual_streams >= 1, "it must be an integer >= 1")

    @classmethod
    def connect_blocks(cls, embed_dim: int, num_blocks: int, settings: StreamSettings):
        """One connection per block; block l reads stream l mod n at the start; the last holds the readout."""
        return [cls(embed_dim, settings.residual_streams, home=block % settings.residual_streams,
                    dynamic=settings.stream_weights == "dynamic", last=block == num_blocks - 1,
                    **cls.connection_kwargs(settings))
                for block in range(num_blocks)]

    @classmethod
    def connection_kwargs(cls, settings: StreamSettings) -> Dict[str, object]:
        """The constructor's keyword arguments of the settings every stream family reads."""
        return {"kernels": settings.connection_kernels}

    def __init__(self, embed_dim: int, num_streams: int, home: int = 0, dynamic: bool = True, last: bool = True,
                 kernels: str = "auto"):
        super().__init__(embed_dim, 1)
        self.num_streams = num_streams
        self.dynamic = dynamic
        self.kernels = kernels
        if last:  # the stack's readout, sum_i readout_i H_i, after every block (its output after the top one)
            readout = torch.zeros(num_streams)
            readout[0] = 1.0
            self.readout = nn.Parameter(readout)
            self.readout.no_weight_decay = True

    def expand(self, x: Tensor) -> Tensor:
        """(T, B, C) embedding output -> (T, B, n, C) streams, n copies."""
        return x.unsqueeze(2).expand(*x.shape[:2], self.num_streams, x.shape[-1]).contiguous()

    def weights(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(a, r, b) in fp32: (T, B, n), (T, B, n, n) and (T, B, n) at every position, or (n), (n, n) and
        (n) when they are the same everywhere (static weights only)."""
        raise NotImplementedError

    def read(self, streams: Tensor, weights: Tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """The block's input h = sum_i a_i H_i, (T, B, C)."""
        return (weights[0].to(streams.dtype).unsqueeze(-1) * streams).sum(-2)

    def read_with_weights(self, streams: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """The block's input h and the weights (r, b) of its write: :meth:`weights` and :meth:`read`, which a
        family with a fused read computes in one operator."""
        weights = self.weights(streams)
        return self.read(streams, weights), weights[1:]

    def write(self, streams: Tensor, weights: Tuple[Tensor, Tensor], block_input: Tensor, block_output: Tensor,
              readout: Tensor) -> Tuple[Tensor, Tensor]:
        """H'_j = b_j y + (sum_i r_ij H_i - b_j h), (T, B, n, C), with ``weights`` (r, b), and the stack's state after
        it, sum_j readout_j H'_j, (T, B, C), with the top block connection's ``readout`` (:mod:`.stream_write`)."""
        return stream_write(streams, weights[0], weights[1], block_input, block_output, readout, self.kernels)

    def read_after_write(self, streams: Tensor, weights: Tuple[Tensor, Tensor], block_input: Tensor,
                         block_output: Tensor, readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
        """Between two blocks: the write of the block below (:meth:`write`, with its weights (r, b), input, output and
        the stack's readout: H' and the state), then this block's read of H' (:meth:`read_with_weights`: its input
        and the weights of its write), which a family computes in one operator where it can (the streams then have
        one consumer)."""
        streams, state = self.write(streams, weights, block_input, block_output, readout)
        return (streams, state, *self.read_with_weights(streams))

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        raise TypeError(f"{type(self).__name__} connects blocks through residual streams; it aggregates no layers")
