"""Layer aggregation by iterative dynamic routing (Algorithm 1 of Dou et al. 2019)."""

import torch
from torch import Tensor

from .capsules import CapsuleRouting, squash


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

    def route(self, capsules: Tensor, votes: Tensor) -> Tensor:
        logits = votes.new_zeros(votes.shape[:-1])
        for step in range(self.routing_iters):
            agreement = torch.softmax(logits, dim=-1)
            self.record(agreement)
            omega = squash((agreement.unsqueeze(-1) * votes).sum(dim=-3))
            if step + 1 < self.routing_iters:
                logits = logits + (omega.unsqueeze(-3) * votes).sum(dim=-1)
        return omega
