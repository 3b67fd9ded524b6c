"""Ramping a new aggregation path into a network: H~ = (1 - a_t) H^L + a_t Omega."""

import torch
from torch import Tensor, nn


class AggregationRamp(nn.Module):
    """Mixes the top layer into the aggregate while the aggregator is ramped in (not in the paper).

    H~ = (1 - a_t) H^L + a_t Omega with a_t = min(1, t / K), where t is the
    number of updates of the current training run that came before this one
    (fairseq passes it to :meth:`set_num_updates`) and K is
    ``--aggregation-ramp-updates``. At t = 0 the stack is exactly the
    network without aggregation; from update K + 1 on a_t = 1 and H~ = Omega
    exactly (``torch.lerp`` returns its end point at weight 1), which is
    Eq. 5 of Dou et al. (2019). t is a buffer, so it travels with
    checkpoints: a resumed run continues the ramp where it stopped, and a
    saved model decodes with the a_t of its last update.
    """

    def __init__(self, ramp_updates: int):
        super().__init__()
        if ramp_updates < 1:
            raise ValueError(f"ramp_updates must be >= 1, got {ramp_updates}")
        self.ramp_updates = ramp_updates
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def set_num_updates(self, num_updates: int) -> None:
        self.num_updates.fill_(num_updates)

    def weight(self) -> Tensor:
        """a_t, a 0-dim fp32 tensor in [0, 1] (no host sync)."""
        return (self.num_updates.float() / self.ramp_updates).clamp(max=1.0)

    def forward(self, top: Tensor, aggregate: Tensor) -> Tensor:
        """(T, B, C) top layer H^L and aggregate Omega -> (T, B, C) H~."""
        return torch.lerp(top, aggregate, self.weight().to(aggregate.dtype))
