"""Manifold-constrained hyper-connections, mHC (DeepSeek-AI, "mHC: Manifold-Constrained Hyper-Connections",
2025)."""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from ..numerics import norm_linear_reference
from ..ops.dispatch import runs_fused
from ..ops.mhc_read import clamped_gate, mhc_read
from ..ops.sinkhorn import SINKHORN_ITERATIONS, mhc_mix, sinkhorn
from ..ops.write_read import mhc_write_read
from ..registry import register_aggregator
from .streams import StreamConnection, StreamSettings


def start_logits(n: int, home: int) -> Tuple[Tensor, Tensor]:
    """b_pre (n) and b_res (n, n) of the start: sigmoid(b_pre) is 1/2 on the block's own stream ``home`` and
    1/(2(n - 1)) on each other one (summing to 1), Sinkhorn(b_res) 1/2 on the diagonal and 1/(2(n - 1)) elsewhere;
    neither saturated, so both take gradients of the order of the weights they multiply."""
    others = max(n - 1, 1)
    pre = torch.full((n,), -math.log(max(2 * n - 3, 1)))
    pre[home] = 0.0
    return pre, math.log(others) * torch.eye(n)


@register_aggregator
class ManifoldHyperConnections(StreamConnection):
    """One block's mHC: x_{l+1} = H_res x_l + H_post^T F(H_pre x_l) with H_pre = sigmoid(.), H_post =
    2 sigmoid(.) and H_res doubly stochastic by Sinkhorn-Knopp (Eqs. 3-8 of the paper), so that the
    product of the H_res over depth keeps a gain near 1.

    The logits are static plus alpha (x~ phi) with x~ the RMS-normalised n x d streams of the position
    and phi = 0, alpha = 0.01 at the start, in fp32.

    The start is the pre-norm Transformer without saturating a weight. The n streams start as copies of the
    embedding output, and weights that keep them copies compute the Transformer: any H_res whose rows (each
    new stream's weights) sum to 1, H_post = 1, and a read whose weights sum to 1. So H_res and H_post are
    the paper's from the first step, at logits where they learn: b_res log(n - 1) on the diagonal and 0
    elsewhere (:func:`start_logits`), b_post 0 (H_post = 2 sigmoid(0) = 1). Only the read is blended from
    the Transformer's, H_pre = e_l + g (sigmoid - e_l) with a gate g = clamp(gate, 0, 1), 0 at the start
    (a sigmoid never gives the one-hot read that n = 1 needs), the gradient passed through the clamp;
    sigmoid(b_pre) sums to 1, so the read stays convex as g opens. The streams part once H_post writes
    them differently; until then, and in the first block always (it mixes copies), H_res's gradient is zero.
    The static weights and the gate are marked ``no_weight_decay``.

    A checkpoint saved before this start (without ``shared_gate``) blended all three weights by its gate,
    H_res = I + g (Sinkhorn - I) and H_post = 1 + g (2 sigmoid - 1), from saturated logits (H_res's Sinkhorn
    the identity to 1e-4, so its logits took no gradient); it loads so and computes what it did.
    """

    name = "mhc"
    family = "mhc"
    label = "mHC"

    def __init__(self, embed_dim: int, num_streams: int, home: int = 0, dynamic: bool = True, last: bool = True,
                 kernels: str = "auto"):
        super().__init__(embed_dim, num_streams, home, dynamic, last, kernels)
        n = num_streams
        self.home_stream = home  # the fused read's argument (an int: no tensor to read back from a GPU)
        self.register_buffer("home", torch.nn.functional.one_hot(torch.tensor(home), n).float(), persistent=False)
        self.register_buffer("identity", torch.eye(n), persistent=False)
        pre, res = start_logits(n, home)
        self.pre_logits = nn.Parameter(pre)
        self.post_logits = nn.Parameter(torch.zeros(n))
        self.res_logits = nn.Parameter(res)
        self.gate = nn.Parameter(torch.zeros(()))
        self.register_buffer("shared_gate", torch.tensor(False))
        self.gate_shared = False  # the buffer's value, read once where it is loaded (no read back from a GPU)
        for static in (self.pre_logits, self.post_logits, self.res_logits, self.gate):
            static.no_weight_decay = True
        if dynamic:
            self.phi = nn.Linear(n * embed_dim, 2 * n + n * n, bias=False)
            nn.init.zeros_(self.phi.weight)
            self.alpha = nn.Parameter(torch.full((3,), 0.01))  # pre, post, res

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: StreamSettings) -> float:
        """One block's read, mix, write and readout, the dynamic logits and Sinkhorn's iterations."""
        n = settings.residual_streams
        static = (n + n * n + 2 * n + n) * embed_dim + SINKHORN_ITERATIONS * 4 * n * n
        dynamic = n * embed_dim * (1 + 2 * n + n * n) if settings.stream_weights == "dynamic" else 0
        return static + dynamic

    @classmethod
    def between_blocks_multiply_adds(cls, embed_dim: int, num_blocks: int, settings: StreamSettings) -> float:
        return num_blocks * cls.multiply_adds(embed_dim, 1, settings)

    def gate_value(self) -> Tensor:
        """g = clamp(gate, 0, 1) forward, the identity backward."""
        return clamped_gate(self.gate)

    def logits(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The logits of H_pre (T, B, n), H_post (T, B, n) and H_res (T, B, n, n), fp32; with static weights
        only, (n), (n) and (n, n), the same at every position."""
        n = self.num_streams
        pre, post, res = self.pre_logits.float(), self.post_logits.float(), self.res_logits.float()
        if self.dynamic:
            dynamic = norm_linear_reference(streams.flatten(-2), self.phi.weight, tanh=False)
            alpha = self.alpha.float()
            pre = pre + alpha[0] * dynamic[..., :n]
            post = post + alpha[1] * dynamic[..., n:2 * n]
            res = res + alpha[2] * dynamic[..., 2 * n:].unflatten(-1, (n, n))
        return pre, post, res

    def constrained(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """The paper's H_pre, H_post and H_res (the latter as mixing rows: stream i into stream j)."""
        pre, post, res = self.logits(streams)
        doubly_stochastic = sinkhorn(res, kernel=self.kernels)
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), doubly_stochastic.transpose(-1, -2)

    def weights(self, streams: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        pre, post, res = self.constrained(streams)
        gate = self.gate_value()
        read = self.home + gate * (pre - self.home)
        if not self.gate_shared:
            return read, res, post
        return read, self.identity + gate * (res - self.identity), 1 + gate * (post - 1)

    def mixing_gate(self) -> Optional[Tensor]:
        """The gate that blends H_res from the identity: none, but in a checkpoint of the start before."""
        return self.gate if self.gate_shared else None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        """A checkpoint saved before ``shared_gate`` existed blended all three weights by its gate: loaded so."""
        key = prefix + "shared_gate"
        if key not in state_dict and prefix + "gate" in state_dict:
            state_dict[key] = torch.tensor(True)
        if key in state_dict:
            self.gate_shared = bool(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def read_with_weights(self, streams: Tensor) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        """With dynamic weights, the logits, H_pre, H_post and the read as one operator each way
        (:mod:`.mhc_read`), and H_res from its logits, Sinkhorn-Knopp and the blend as another
        (:func:`.sinkhorn.mhc_mix`)."""
        if not self.dynamic or not runs_fused(self.kernels, streams):
            return super().read_with_weights(streams)
        block_input, res_logits, write = mhc_read(streams, self.phi.weight, self.pre_logits, self.post_logits,
                                                  self.res_logits, self.alpha, self.gate, self.home_stream,
                                                  self.gate_shared, self.kernels)
        return block_input, (mhc_mix(res_logits, self.mixing_gate(), kernel=self.kernels), write)

    def read_after_write(self, streams: Tensor, weights: Tuple[Tensor, Tensor], block_input: Tensor,
                         block_output: Tensor, readout: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tuple[Tensor, Tensor]]:
        """With dynamic weights (the write's too: r and b at every position), the write and the fused read as one
        operator each way (:func:`.write_read.mhc_write_read`), and H_res from its logits as in
        :meth:`read_with_weights`."""
        if not (self.dynamic and weights[1].dim() > 1 and runs_fused(self.kernels, streams)):
            return super().read_after_write(streams, weights, block_input, block_output, readout)
        streams, state, block_input, res_logits, write = mhc_write_read(
            streams, *weights, block_input, block_output, readout, self.phi.weight, self.pre_logits, self.post_logits,
            self.res_logits, self.alpha, self.gate, self.home_stream, self.gate_shared)
        return streams, state, block_input, (mhc_mix(res_logits, self.mixing_gate(), kernel=self.kernels), write)
