"""Tiny routing modules and their layer inputs, for the routing tests."""

import torch

from fairseq_capsagg.aggregators import build_aggregator

T, B, D, L = 3, 2, 8, 4


ROUTINGS = ["dynamic-routing", "em-routing"]


def build(name, n_caps=4, iters=3, capsule_input="all", seed=0, **settings):
    """``capsule_input`` 'all-rank3' means 'all' factorised through a rank-3 bottleneck."""
    torch.manual_seed(seed)
    rank = int(capsule_input.split("rank")[1]) if "rank" in capsule_input else 0
    cfg = {"output_capsules": n_caps, "routing_iters": iters, "capsule_input": capsule_input.split("-")[0],
           "capsule_rank": rank, **settings}
    agg = build_aggregator(name, D, L, cfg)
    if name == "em-routing":
        with torch.no_grad():  # non-trivial betas so that Eq. 15 is exercised
            agg.beta_a.normal_()
            agg.beta_mu.normal_(std=0.1)
    return agg


def layers(t=T, b=B, scale=1.0, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(t, b, D, generator=g) for _ in range(L)]
