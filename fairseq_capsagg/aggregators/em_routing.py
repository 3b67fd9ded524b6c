"""Layer aggregation by EM routing (Algorithm 2 of Dou et al. 2019)."""

import math
from dataclasses import dataclass
from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .capsules import ROUTING_EPS, CapsuleRouting, RoutingSettings
from .registry import register_aggregator
from .settings import setting

#: Floor of the per-dimension variance (sigma_n^h)^2 of Eq. 14.
VARIANCE_FLOOR = 1e-4

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class EMRoutingSettings(RoutingSettings):
    em_inverse_temperature: float = setting(1.0, "EM routing: final inverse temperature lambda", metavar="LAMBDA")


@register_aggregator
class EMRouting(CapsuleRouting):
    """Fits N Gaussians (output capsules) to the L votes by EM (Algorithm 2).

    * Input activations A^H_l = logistic(W^H_l H^_l + b_l) (Eq. 11); the paper
      leaves Eq. 11 linear, the logistic makes it the probability it is used as.
    * C_{l->n} = 1/N at the start. Each of the T iterations runs
      the M-step: R = C * A^H; mu_n and per-dimension sigma_n^2 are the
      R-weighted mean and variance of the votes (Eqs. 12-13, the variance
      floored at 1e-4); cost_n^h = (log sigma_n^h + (1 + log 2 pi) / 2)
      * sum_l R_{l->n} (Eq. 14); A^Omega_n = logistic(lambda_t (beta_A -
      beta_mu sum_l R_{l->n} - sum_h cost_n^h)) (Eq. 15), with learned beta_A,
      beta_mu per output capsule;
      then the E-step: C_{l->n} = softmax_n(log A^Omega_n + log p_n(V_{l->n}))
      with the diagonal Gaussian log-density p_n (Eqs. 16-17), all in log space.
    * lambda schedule: lambda_t = lambda * t / T for t = 1..T, so the
      activations sharpen as the assignments settle (Hinton et al. 2018 also
      raise the inverse temperature over iterations); lambda is
      ``--em-inverse-temperature``.
    * Output Omega_n = A^Omega_n * mu_n, concatenated over n. The last E-step
      is skipped because its C is never read.

    The sums over the L votes are element-wise products summed over l, not
    einsums: with the paper's N = d capsules of width 1, an einsum becomes
    millions of 1 x L by L x 1 matrix products.

    :attr:`input_activations` (T, B, L) and :attr:`output_activations` (one
    (T, B, N) tensor per iteration) are recorded with the agreement when
    capturing.
    """

    name = "em-routing"
    family = "emrouting"
    label = "EM Routing"
    Settings = EMRoutingSettings

    @classmethod
    def validate(cls, settings: EMRoutingSettings, embed_dim: int, side: str = "") -> None:
        super().validate(settings, embed_dim, side)
        settings.require("em_inverse_temperature", settings.em_inverse_temperature > 0, "it must be > 0")

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: EMRoutingSettings) -> "EMRouting":
        return cls(embed_dim, num_layers, **cls.routing_kwargs(embed_dim, settings),
                   inverse_temperature=settings.em_inverse_temperature)

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: EMRoutingSettings) -> float:
        """Routing's, plus the input activations of Eq. 11."""
        return super().multiply_adds(embed_dim, num_layers, settings) + num_layers * embed_dim

    def __init__(self, embed_dim: int, num_layers: int, output_capsules: int, routing_iters: int,
                 capsule_input: str = "all", capsule_rank: int = 0, compile_routing: bool = False,
                 routing_init: str = "random", inverse_temperature: float = 1.0):
        super().__init__(embed_dim, num_layers, output_capsules, routing_iters, capsule_input, capsule_rank,
                         compile_routing, routing_init)
        self.inverse_temperature = inverse_temperature
        self.activation_weight = nn.Parameter(torch.empty(num_layers, embed_dim))
        self.reset_input_activations()
        self.activation_bias = nn.Parameter(torch.zeros(num_layers))
        self.beta_a = nn.Parameter(torch.zeros(output_capsules))
        self.beta_mu = nn.Parameter(torch.zeros(output_capsules))
        self.input_activations: Tensor = torch.empty(0)
        self.output_activations: List[Tensor] = []

    @torch.no_grad()
    def reset_input_activations(self) -> None:
        """W^H_l of Eq. 11: normal with std d^-1/2, or zero under ``routing_init='identity'``,
        so that every input capsule starts equally active and the first M-step's mean is the
        plain average of the votes."""
        if self.routing_init == "identity":
            nn.init.zeros_(self.activation_weight)
        else:
            nn.init.normal_(self.activation_weight, std=self.embed_dim ** -0.5)

    def route(self, capsules: Tensor, votes: Tensor) -> Tensor:
        weight = self.activation_weight.float()
        input_act = torch.sigmoid(
            torch.einsum("...ld,ld->...l", capsules, weight) + self.activation_bias.float()
        )
        if self.capture_agreement:
            self.input_activations = input_act.detach()
            self.output_activations = []
        beta_a, beta_mu = self.beta_a.float(), self.beta_mu.float()
        agreement = votes.new_full(votes.shape[:-1], 1.0 / self.output_capsules)
        for step in range(self.routing_iters):
            self.record(agreement)
            # M-step (Eqs. 12-15)
            resp = agreement * input_act.unsqueeze(-1)
            resp_sum = resp.sum(dim=-2)
            # R_{l->n} / sum_l R_{l->n}: mu and sigma^2 as weighted sums over the L votes
            share = (resp / (resp_sum.unsqueeze(-2) + ROUTING_EPS)).unsqueeze(-1)
            mu = (share * votes).sum(dim=-3)
            sq_dev = (votes - mu.unsqueeze(-3)).square()
            var = (share * sq_dev).sum(dim=-3) + VARIANCE_FLOOR
            log_var = torch.log(var)
            cost = ((0.5 * log_var + 0.5 + _HALF_LOG_2PI) * resp_sum.unsqueeze(-1)).sum(dim=-1)
            lam = self.inverse_temperature * (step + 1) / self.routing_iters
            act_logit = lam * (beta_a - beta_mu * resp_sum - cost)
            if self.capture_agreement:
                self.output_activations.append(torch.sigmoid(act_logit).detach())
            if step + 1 < self.routing_iters:
                # E-step (Eqs. 16-17) in log space
                log_p = -0.5 * (sq_dev / var.unsqueeze(-3) + log_var.unsqueeze(-3)).sum(dim=-1)
                log_p = log_p - self.capsule_dim * _HALF_LOG_2PI
                agreement = torch.softmax(F.logsigmoid(act_logit).unsqueeze(-2) + log_p, dim=-1)
        return torch.sigmoid(act_logit).unsqueeze(-1) * mu
