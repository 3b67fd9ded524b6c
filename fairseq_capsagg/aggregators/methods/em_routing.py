"""Layer aggregation by EM routing (Algorithm 2 of Dou et al. 2019)."""

from dataclasses import dataclass
from typing import List

import torch
from torch import Tensor, nn

from ..ops.em_route import em_iterations, em_route
from ..ops.input_activation import input_activation
from ..registry import register_aggregator
from ..settings import setting
from .capsules import CapsuleRouting, RoutingSettings


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

    The iterations are :mod:`.em_route`'s: one fused operator each way where
    ``--connection-kernels`` runs it (on CUDA by default), else the eager loop,
    which also runs under ``--compile-routing`` and while the agreement is
    captured.

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
                 routing_init: str = "random", inverse_temperature: float = 1.0, kernels: str = "auto"):
        super().__init__(embed_dim, num_layers, output_capsules, routing_iters, capsule_input, capsule_rank,
                         compile_routing, routing_init, kernels)
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
        # A^H_l (Eq. 11) in fp32; under --compile-routing the reference, for torch.compile to fuse with the loop
        kernel = "eager" if torch.compiler.is_compiling() else self.kernels
        input_act = input_activation(capsules, self.activation_weight, self.activation_bias, kernel)
        if not self.capture_agreement and not torch.compiler.is_compiling():
            return em_route(votes, input_act, self.beta_a, self.beta_mu, self.routing_iters, self.inverse_temperature,
                            self.kernels)
        votes, beta_a, beta_mu = votes.float(), self.beta_a.float(), self.beta_mu.float()
        if not self.capture_agreement:  # compiled (--compile-routing): the loop, for torch.compile to fuse
            return em_iterations(votes, input_act, beta_a, beta_mu, self.routing_iters, self.inverse_temperature)
        self.input_activations = input_act.detach()
        self.output_activations = []

        def record(agreement: Tensor, act_logit: Tensor) -> None:
            self.record(agreement)
            self.output_activations.append(torch.sigmoid(act_logit).detach())

        return em_iterations(votes, input_act, beta_a, beta_mu, self.routing_iters, self.inverse_temperature, record)
