"""Layer aggregation by iterative dynamic routing (Algorithm 1 of Dou et al. 2019)."""

from dataclasses import dataclass
from typing import Dict

import torch
from torch import Tensor

from ..ops.dynamic_route import dynamic_route, routing_iterations
from ..registry import register_aggregator
from ..settings import setting
from .capsules import CapsuleRouting, RoutingSettings

#: ``--routing-softmax`` values: what the agreement C_{l->n} sums to 1 over.
SOFTMAX_AXES = ("output", "input")


@dataclass
class DynamicRoutingSettings(RoutingSettings):
    routing_softmax: str = setting(
        "output", "dynamic routing: the routing softmax of Eq. 10 over the N output capsules, so that "
                  "sum_n C_l->n = 1 (output, the paper's), or over the L input capsules, so that "
                  "sum_l C_l->n = 1 (input; not the paper's)", choices=SOFTMAX_AXES)


@register_aggregator
class DynamicRouting(CapsuleRouting):
    """Routes L input capsules to N output capsules by agreement (Algorithm 1).

    Per position, with logits B_{l->n} = 0 at the start and for T iterations:
    C_{l->n} = softmax_n(B_{l->n}) (Eq. 10), S_n = sum_l C_{l->n} V_{l->n}
    (Eq. 7), Omega_n = squash(S_n) (Eq. 6), B_{l->n} += Omega_n . V_{l->n}.
    The output is the concatenation [Omega_1; ...; Omega_N] of width d. The
    last iteration's logit update is skipped because nothing reads it. The
    iterations are :mod:`..ops.dynamic_route`'s: one fused operator each way where
    ``--connection-kernels`` runs it (on CUDA by default), else the eager loop,
    which also runs under ``--compile-routing`` and while the agreement is
    captured.

    With ``routing_softmax='input'`` (not the paper's) the softmax of Eq. 10
    runs over the L input capsules instead, so each output capsule receives a
    convex combination of its L votes: S_n starts as their mean, at the
    votes' own scale for any N, and routing reweights layers per output
    capsule instead of making the N output capsules compete for each layer.
    See :meth:`vote_gain` for why the paper's softmax fails at N = d.

    When capturing, :attr:`capsule_lengths` (T, B, N) keeps |Omega_n| of the
    last iteration with the agreement: squash bounds it below 1, and with
    scalar capsules a length near 0 (dead) or near 1 (only the sign left) is
    where Eq. 6 stops passing magnitudes on.
    """

    name = "dynamic-routing"
    family = "dynrouting"
    label = "Dynamic Routing"
    Settings = DynamicRoutingSettings
    #: Its architectures route to N = 2 output capsules of width d/2: of the widths measured one epoch from scratch
    #: (docs/results/dynrouting-capsules-cpu.md), the best at which routing still routes (at N = 1 the softmax over
    #: one capsule routes nothing; at the flag's default N = d the model does not learn). EM routing keeps N = d.
    architecture_settings = {"output_capsules": 2}

    @classmethod
    def routing_kwargs(cls, embed_dim: int, settings: DynamicRoutingSettings) -> Dict[str, object]:
        return {**super().routing_kwargs(embed_dim, settings), "routing_softmax": settings.routing_softmax}

    def __init__(self, embed_dim: int, num_layers: int, output_capsules: int, routing_iters: int, *args,
                 routing_softmax: str = "output", **kwargs):
        self.routing_softmax = routing_softmax  # read by vote_gain() during the parent's initialisation
        super().__init__(embed_dim, num_layers, output_capsules, routing_iters, *args, **kwargs)
        self.capsule_lengths: Tensor = torch.empty(0)

    def vote_gain(self) -> float:
        """max(1, (N / L)^0.4) with the paper's softmax: 3.4 at N = d = 128 with L = 6, 5.9
        at N = d = 512; 1 with the softmax over input capsules, where C starts at 1/L.

        With C = 1/N in the first iteration, S_n = (1/N) sum_l V_{l->n}; for
        scalar capsules (N = d) it is so small that squash(S) ~ S|S| leaves
        the aggregate at the scale of the LayerNorm's eps after it (measured
        with ``capsagg-health``: aggregate std 2e-3 at the small shape with
        gain 1). Votes N times larger would undo the 1/N but make the logit
        updates Omega . V saturate the routing softmax (gradient norm 25-100x
        the vanilla model's at gains sqrt(N) or N/L). The exponent was chosen
        with the same report at the small and base shapes: 1/3 still leaves
        the base aggregate 17% eps, 1/2 raises the gradient norm 2.7x (small)
        and 4.8x (base); 0.4 keeps both within 1.2x of the vanilla model's.
        That only holds at initialisation: trained from scratch, the softmax
        still saturates (one output capsule per input capsule) and the model
        does not learn (``--routing-softmax input`` does).
        Capsules of width > 1 (N well below d) need no gain.
        """
        if self.routing_softmax == "input":
            return 1.0
        return max(1.0, (self.output_capsules / self.num_layers) ** 0.4)

    def route(self, capsules: Tensor, votes: Tensor) -> Tensor:
        over_inputs = self.agreement_dim == -2
        if not self.capture_agreement and not torch.compiler.is_compiling():
            return dynamic_route(votes, self.routing_iters, over_inputs, self.kernels)
        omega = routing_iterations(votes.float(), self.routing_iters, over_inputs, self.record)
        if self.capture_agreement:
            self.capsule_lengths = omega.detach().norm(dim=-1)
        return omega
