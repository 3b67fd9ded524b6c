"""Layer aggregation by iterative dynamic routing (Algorithm 1 of Dou et al. 2019)."""

import torch
from torch import Tensor

from .capsules import CapsuleRouting, squash
from .registry import register_aggregator


@register_aggregator
class DynamicRouting(CapsuleRouting):
    """Routes L input capsules to N output capsules by agreement (Algorithm 1).

    Per position, with logits B_{l->n} = 0 at the start and for T iterations:
    C_{l->n} = softmax_n(B_{l->n}) (Eq. 10), S_n = sum_l C_{l->n} V_{l->n}
    (Eq. 7), Omega_n = squash(S_n) (Eq. 6), B_{l->n} += Omega_n . V_{l->n}.
    The output is the concatenation [Omega_1; ...; Omega_N] of width d. The
    last iteration's logit update is skipped because nothing reads it.
    Both sums are element-wise products summed over one axis (see
    :class:`~fairseq_capsagg.aggregators.em_routing.EMRouting` for why not einsums).
    """

    name = "dynamic-routing"
    family = "dynrouting"
    label = "Dynamic Routing"

    def vote_gain(self) -> float:
        """max(1, (N / L)^0.4): 3.4 at N = d = 128 with L = 6, 5.9 at N = d = 512.

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
        Capsules of width > 1 (N well below d) need no gain. Algorithm 1
        itself is unchanged.
        """
        return max(1.0, (self.output_capsules / self.num_layers) ** 0.4)

    def route(self, capsules: Tensor, votes: Tensor) -> Tensor:
        logits = votes.new_zeros(votes.shape[:-1])
        for step in range(self.routing_iters):
            agreement = torch.softmax(logits, dim=-1)
            self.record(agreement)
            omega = squash((agreement.unsqueeze(-1) * votes).sum(dim=-3))
            if step + 1 < self.routing_iters:
                logits = logits + (omega.unsqueeze(-3) * votes).sum(dim=-1)
        return omega
