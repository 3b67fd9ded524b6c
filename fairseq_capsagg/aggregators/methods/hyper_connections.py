"""Hyper-connections (Zhu et al., "Hyper-Connections", ICLR 2025)."""

from typing import Tuple

import torch
from torch import Tensor, nn

from ..numerics import norm_linear_reference
from ..ops.dispatch import runs_fused
from ..ops.hyper_read import hyper_read
from ..ops.write_read import hyper_write_read
from ..registry import register_aggregator
from .streams import StreamConnection, StreamSettings


@register_aggregator
class HyperConnections(StreamConnection):
    """One block's hyper-connection: the matrix [[0, B], [A_m, A_r]] of Zhu et al. (Eqs. 1-5), static plus
    dynamic weights (their DHC, Eqs. 10-13).

    a = A_m, r = A_r and b = B of :mod:`.streams`; the static part starts as A_m one-hot on stream
    (l mod n), A_r = I and B = 1, the pre-norm Transformer exactly. The dynamic part of stream i is
    s_a tanh(norm(H_i) W_a) for its row [A_m,i, A_r,i.] and s_b tanh(norm(H_i) W_b) for B_i, with W = 0
    and s = 0.01 at the start (the paper's), computed in fp32. ``norm`` is an RMS normalisation without a
    learned scale. The static weights are marked ``no_weight_decay`` (decaying A_r and B towards 0 is what
    made the paper's runs unstable).
    """

    name = "hyper-connections"
    family = "hc"
    label = "Hyper-connections"

    def __init__(self, embed_dim: int, num_streams: int, home: int = 0, dynamic: bool = True, last: bool = True,
                 kernels: str = "auto"):
        super().__init__(embed_dim, num_streams, home, dynamic, last, kernels)
        read = torch.zeros(num_streams)
        read[home] = 1.0
        self.static_read = nn.Parameter(read)
        self.static_mix = nn.Parameter(torch.eye(num_streams))
        self.static_write = nn.Parameter(torch.ones(num_streams))
        for static in (self.static_read, self.static_mix, self.static_write):
            static.no_weight_decay = True
        if dynamic:
            self.dynamic_read_mix = nn.Linear(embed_dim, num_streams + 1, bias=False)
            self.dynamic_write = nn.Linear(embed_dim, 1, bias=False)
            nn.init.zeros_(self.dynamic_read_mix.weight)
            nn.init.zeros_(self.dynamic_write.weight)
            self.read_mix_scale = nn.Parameter(torch.tensor(0.01))
            self.write_scale = nn.Parameter(torch.tensor(0.01))

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: StreamSettings) -> float:
        """One block's read, mix, write and readout, and the dynamic weights (norm and two projections)."""
        n = settings.residual_streams
        static = (n + n * n + 2 * n + n) * embed_dim
        dynamic = (n + n * (n + 2)) * embed_dim if settings.stream_weights == "dynamic" else 0
        return static + dynamic

    @classmethod
    def between_blocks_multiply_adds(cls, embed_dim: int, num_blocks: int, settings: StreamSettings) -> float:
        return num_blocks * cls.multiply_adds(embed_dim, 1, settings)

    def weights(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        read, mix, write = self.static_read.float(), self.static_mix.float(), self.static_write.float()
        if self.dynamic:
            gates = norm_linear_reference(streams, self.projection(), tanh=True)  # (T, B, n, n + 2) fp32
            read_mix, write_gate = gates[..., :-1] * self.read_mix_scale.float(), gates[..., -1]
            read = read + read_mix[..., 0]
            mix = mix + read_mix[..., 1:]
            write = write + self.write_scale.float() * write_gate
        return read, mix, write

    def read_with_weights(self, streams: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """With dynamic weights, :meth:`weights` and :meth:`read` as one operator each way (:mod:`.hyper_read`)."""
        if not self.dynamic or not runs_fused(self.kernels, streams):
            return super().read_with_weights(streams)
        block_input, mix, write = hyper_read(streams, self.projection(), self.static_read, self.static_mix,
                                             self.static_write, self.read_mix_scale, self.write_scale, self.kernels)
        return block_input, (mix, write)

    def projection(self) -> Tensor:
        """[W_a; W_b] (n + 2, C): both dynamic projections of the normalised streams in one product."""
        return torch.cat([self.dynamic_read_mix.weight, self.dynamic_write.weight])

    def read_after_write(self, streams: Tensor, weights: Tuple[Tensor, Tensor], block_input: Tensor,
                         block_output: Tensor, readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
        """With dynamic weights (the write's too: r and b at every position), the write and the fused read as one
        operator each way (:func:`.write_read.hyper_write_read`)."""
        if not (self.dynamic and weights[1].dim() > 1 and runs_fused(self.kernels, streams)):
            return super().read_after_write(streams, weights, block_input, block_output, readout)
        streams, state, block_input, mix, write = hyper_write_read(
            streams, *weights, block_input, block_output, readout, self.projection(), self.static_read,
            self.static_mix, self.static_write, self.read_mix_scale, self.write_scale)
        return streams, state, block_input, (mix, write)
