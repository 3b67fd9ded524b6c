"""Input capsules and votes shared by the routing-by-agreement aggregators."""

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch
from torch import Tensor, nn

from ..base import LayerAggregator
from ..initialisation import xavier_uniform_per_matrix_
from ..settings import AggregationConfigError, KernelSettings, setting

#: delta of ``--routing-init identity``: the share of its own layer H^l in input capsule l.
IDENTITY_LAYER_SHARE = 0.1


@dataclass
class RoutingSettings(KernelSettings):
    """Settings of both routing algorithms (Algorithms 1 and 2)."""

    output_capsules: Optional[int] = setting(
        None, "routing: output capsules of width d/N; N must divide d (default: d, scalar capsules)", metavar="N")
    routing_iters: int = setting(3, "routing: iterations T", metavar="T")
    capsule_input: str = setting(
        "all", "routing: input capsules from all layers F_l(H^1..H^L) (all) or from their own layer F_l(H^l) "
               "(layer, the Table 4 ablation)", choices=("all", "layer"))
    capsule_rank: int = setting(
        0, "routing: factorise the input-capsule maps F_l through a shared rank-R bottleneck "
           "(0: the paper's L distinct maps)", metavar="R")
    compile_routing: bool = setting(
        False, "routing: fuse the T routing iterations (forward and backward) with torch.compile; "
               "same results, less time per update")
    routing_init: str = setting(
        "random", "routing: random (every F_l and W_l->n Glorot-uniform by its own fan-in/out) or identity "
                  "(input capsules and votes carry H^L, for warm starts)", choices=("random", "identity"))

    def num_output_capsules(self, embed_dim: int) -> int:
        """N; scalar capsules (N = d) when ``--output-capsules`` is not given."""
        return embed_dim if self.output_capsules is None else self.output_capsules


_COMPILED_ROUTES: Dict[type, Callable] = {}


def compiled_route(routing_class: type) -> Callable:
    """``torch.compile`` of ``routing_class.route``, made once per class."""
    if routing_class not in _COMPILED_ROUTES:
        _COMPILED_ROUTES[routing_class] = torch.compile(routing_class.route, dynamic=True)
    return _COMPILED_ROUTES[routing_class]


class CapsuleRouting(LayerAggregator):
    """Builds input capsules and votes from the layers; subclasses route them.

    * Input capsules (Eq. 9): H^_l = F_l(H^1, ..., H^L), a distinct linear map
      of the concatenated layers per input capsule (``capsule_input='all'``,
      one (L*d -> L*d) projection, L^2 d^2 multiply-adds), or H^_l = F_l(H^l)
      (``'layer'``, one batched (L, d, d) product; the Table 4 ablation).
      With ``capsule_rank`` r > 0 the maps of ``'all'`` are factorised through
      a shared bottleneck, F_l(H) = U_l (P [H^1; ...; H^L]) + b_l with
      P: L*d -> r shared and U_l: r -> d per capsule, costing 2 L d r instead
      of L^2 d^2 (not in the paper; ``--capsule-rank``).
    * Votes (Eq. 8): V_{l->n} = W_{l->n} H^_l with W_{l->n} in R^{(d/N) x d},
      stored as one (L, d, d) tensor whose rows are split into N capsules.

    Routing itself (:meth:`route`) runs in fp32 with autocast off, whatever
    the model's precision, and its output is cast back. The fused operators
    read the votes as the model made them, in its precision and layout, and
    upcast them as they load them; the eager loops route an fp32 copy.

    When :attr:`capture_agreement` is set, every forward records the
    agreement C (L x N per position) of each iteration before its update
    step in :attr:`agreement`, and the padding mask in
    :attr:`captured_padding_mask`; nothing is recorded otherwise.
    """

    Settings = RoutingSettings
    scaled_output = True
    #: What the agreement C_{l->n} sums to 1 over: the N ``output`` capsules (Eq. 10) or the L ``input`` ones.
    routing_softmax = "output"
    warm_start_flags = ("--routing-init", "identity")

    @property
    def agreement_dim(self) -> int:
        """The axis of the (..., L, N) agreement C that sums to 1: -1 (output capsules) or -2 (input)."""
        return -1 if self.routing_softmax == "output" else -2

    @classmethod
    def validate(cls, settings: RoutingSettings, embed_dim: int, side: str = "") -> None:
        super().validate(settings, embed_dim, side)
        n = settings.num_output_capsules(embed_dim)
        if n < 1 or embed_dim % n != 0:
            divisors = [k for k in range(1, embed_dim + 1) if embed_dim % k == 0]
            raise AggregationConfigError(
                f"--output-capsules: got {n}, but it must be a positive divisor of the "
                f"model dimension {embed_dim} (allowed: {', '.join(map(str, divisors))})")
        settings.require("routing_iters", settings.routing_iters >= 1, "it must be an integer >= 1")
        settings.require("capsule_rank", settings.capsule_rank >= 0,
                         "use 0 (the paper's F_l) or a positive bottleneck width")
        if settings.capsule_rank > 0 and settings.capsule_input != "all":
            raise AggregationConfigError(
                "--capsule-rank factorises F_l(H^1..H^L) and needs --capsule-input all, "
                f"not {settings.capsule_input!r}")
        if settings.routing_init == "identity" and (settings.capsule_input != "all" or settings.capsule_rank > 0):
            raise AggregationConfigError(
                "--routing-init identity needs the full input-capsule maps F_l(H^1..H^L) "
                "(--capsule-input all, --capsule-rank 0): F_l(H^l) cannot see H^L, and a rank-r "
                "bottleneck cannot carry it; use --routing-init random with these settings")

    @classmethod
    def routing_kwargs(cls, embed_dim: int, settings: RoutingSettings) -> Dict[str, object]:
        """The constructor's keyword arguments from the settings."""
        return {"output_capsules": settings.num_output_capsules(embed_dim), "routing_iters": settings.routing_iters,
                "capsule_input": settings.capsule_input, "capsule_rank": settings.capsule_rank,
                "compile_routing": settings.compile_routing, "routing_init": settings.routing_init,
                "kernels": settings.connection_kernels}

    @classmethod
    def from_settings(cls, embed_dim: int, num_layers: int, settings: RoutingSettings) -> "CapsuleRouting":
        return cls(embed_dim, num_layers, **cls.routing_kwargs(embed_dim, settings))

    @classmethod
    def multiply_adds(cls, embed_dim: int, num_layers: int, settings: RoutingSettings) -> float:
        """Input capsules (Eq. 9; 2 L d r when factorised), votes (Eq. 8) and T iterations of
        weighted sums and agreement products over L x N x d/N."""
        rank = settings.capsule_rank
        if settings.capsule_input == "layer":
            inputs = num_layers * embed_dim * embed_dim
        else:
            inputs = 2 * num_layers * embed_dim * rank if rank else (num_layers * embed_dim) ** 2
        votes = num_layers * embed_dim * embed_dim
        return inputs + votes + settings.routing_iters * 3 * num_layers * embed_dim

    def __init__(
        self,
        embed_dim: int,
        num_layers: int,
        output_capsules: int,
        routing_iters: int,
        capsule_input: str = "all",
        capsule_rank: int = 0,
        compile_routing: bool = False,
        routing_init: str = "random",
        kernels: str = "auto",
    ):
        super().__init__(embed_dim, num_layers)
        self.compile_routing = compile_routing
        self.kernels = kernels  # the iterations' implementation: fused operators or the eager loops
        self.output_capsules = output_capsules
        self.capsule_dim = embed_dim // output_capsules
        self.routing_iters = routing_iters
        self.capsule_input = capsule_input
        self.capsule_rank = capsule_rank
        self.routing_init = routing_init
        if capsule_input == "all" and capsule_rank > 0:
            self.capsule_bottleneck = nn.Linear(num_layers * embed_dim, capsule_rank, bias=False)
            self.input_capsule_weight = nn.Parameter(torch.empty(num_layers, embed_dim, capsule_rank))
            self.input_capsule_bias = nn.Parameter(torch.zeros(num_layers, embed_dim))
        elif capsule_input == "all":
            self.input_capsules = nn.Linear(num_layers * embed_dim, num_layers * embed_dim)
        else:
            self.input_capsule_weight = nn.Parameter(torch.empty(num_layers, embed_dim, embed_dim))
            self.input_capsule_bias = nn.Parameter(torch.zeros(num_layers, embed_dim))
        self.vote_weight = nn.Parameter(torch.empty(num_layers, embed_dim, embed_dim))
        self.reset_parameters()
        self.capture_agreement = False
        self.agreement: List[Tensor] = []
        self.captured_padding_mask: Optional[Tensor] = None

    def vote_gain(self) -> float:
        """Scale of the votes at initialisation; 1 unless a routing algorithm needs another."""
        return 1.0

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialises F_l and W_{l->n}: ``random`` (each matrix Glorot-uniform by its own
        fan-in and fan-out) or ``identity`` (:meth:`reset_to_identity`)."""
        if self.capsule_input == "all" and self.capsule_rank > 0:
            nn.init.xavier_uniform_(self.capsule_bottleneck.weight)
            xavier_uniform_per_matrix_(self.input_capsule_weight)
            nn.init.zeros_(self.input_capsule_bias)
        elif self.capsule_input == "all":
            # one (d x L*d) map F_l per input capsule, stored as the rows of one Linear
            xavier_uniform_per_matrix_(self.input_capsules.weight.view(self.num_layers, self.embed_dim, -1))
            nn.init.zeros_(self.input_capsules.bias)
        else:
            xavier_uniform_per_matrix_(self.input_capsule_weight)
            nn.init.zeros_(self.input_capsule_bias)
        # each W_{l->n} is a (d/N x d) block of the (L, d, d) vote tensor
        votes = self.vote_weight.view(self.num_layers, self.output_capsules, self.capsule_dim, self.embed_dim)
        xavier_uniform_per_matrix_(votes, gain=self.vote_gain())
        if self.routing_init == "identity":
            self.reset_to_identity()

    @torch.no_grad()
    def reset_to_identity(self) -> None:
        """Input capsules and votes that carry the top layer H^L.

        F_l(H^1..H^L) = (1 - delta) H^L + delta H^l with delta =
        :data:`IDENTITY_LAYER_SHARE` (F_L = H^L), and W_l = g I (so each
        W_{l->n} is the n-th block of rows of g I, g = :meth:`vote_gain`).
        Every vote then equals H^L up to the delta share of its own layer:
        a routed mean of the votes is H^L plus a small mix of the other
        layers, and the votes disagree a little, which keeps EM routing's
        variances above their floor (all votes equal would put every sigma^2
        at the floor, where the E-step's gradients are 1/floor large).
        """
        num_layers, d = self.num_layers, self.embed_dim
        eye = torch.eye(d, device=self.vote_weight.device, dtype=self.vote_weight.dtype)
        weight = torch.zeros(num_layers, d, num_layers, d, device=eye.device, dtype=eye.dtype)
        for layer in range(num_layers):
            weight[layer, :, num_layers - 1] += (1.0 - IDENTITY_LAYER_SHARE) * eye
            weight[layer, :, layer] += IDENTITY_LAYER_SHARE * eye
        self.input_capsules.weight.copy_(weight.view(num_layers * d, num_layers * d))
        nn.init.zeros_(self.input_capsules.bias)
        self.vote_weight.copy_(self.vote_gain() * eye.expand(num_layers, d, d))

    def build_input_capsules(self, layers: Tensor) -> Tensor:
        """(T, B, L, d) layers -> (T, B, L, d) input capsules H^_l (Eq. 9)."""
        t, b, num_layers, d = layers.shape
        if self.capsule_input == "all" and self.capsule_rank > 0:
            shared = self.capsule_bottleneck(layers.reshape(t, b, -1))
            return torch.einsum("tbr,ldr->tbld", shared, self.input_capsule_weight) + self.input_capsule_bias
        if self.capsule_input == "all":
            return self.input_capsules(layers.reshape(t, b, -1)).view(t, b, num_layers, d)
        return torch.einsum("tblk,ldk->tbld", layers, self.input_capsule_weight) + self.input_capsule_bias

    def build_votes(self, capsules: Tensor) -> Tensor:
        """(T, B, L, d) input capsules -> (T, B, L, N, d/N) votes V_{l->n} (Eq. 8)."""
        votes = torch.einsum("tblk,ldk->tbld", capsules, self.vote_weight)
        return votes.unflatten(-1, (self.output_capsules, self.capsule_dim))

    def aggregate(self, layers: Tensor, padding_mask: Optional[Tensor]) -> Tensor:
        capsules = self.build_input_capsules(layers)
        votes = self.build_votes(capsules)
        if self.capture_agreement:
            self.agreement = []
            self.captured_padding_mask = None if padding_mask is None else padding_mask.detach()
        return self.route_fp32(capsules, votes).flatten(-2).to(layers.dtype)

    def route_fp32(self, capsules: Tensor, votes: Tensor) -> Tensor:
        """:meth:`route` with autocast off: the routing in fp32, whatever the model's precision.

        With ``compile_routing`` the iterations run through ``torch.compile``
        (one compiled function per routing class, shapes dynamic) on fp32
        copies, except while agreement is captured, which needs the eager loop.
        """
        with torch.autocast(device_type=capsules.device.type, enabled=False):
            if self.compile_routing and not self.capture_agreement:
                return compiled_route(type(self))(self, capsules.float(), votes.float())
            return self.route(capsules, votes)

    @torch.no_grad()
    def describe_fault(self, layers: Tensor, padding_mask: Optional[Tensor]) -> str:
        where = f"{self.side or 'the'} aggregator {type(self).__name__}"
        capsules = self.build_input_capsules(layers)
        if not torch.isfinite(capsules).all():
            return f"{where}: non-finite input capsules H^_l = F_l(H^1..H^L) (Eq. 9)"
        votes = self.build_votes(capsules)
        if not torch.isfinite(votes).all():
            return f"{where}: non-finite votes V_l->n (Eq. 8)"
        capturing, self.capture_agreement, self.agreement = self.capture_agreement, True, []
        try:
            omega = self.route_fp32(capsules, votes)
            for step, agreement in enumerate(self.agreement, 1):
                if not torch.isfinite(agreement).all():
                    return f"{where}: non-finite agreement C at routing iteration {step} of {self.routing_iters}"
        finally:
            self.capture_agreement = capturing
        if not torch.isfinite(omega).all():
            return f"{where}: non-finite output capsules after routing iteration {self.routing_iters}"
        return f"{where}: output capsules overflow {layers.dtype} when cast back"

    def record(self, agreement: Tensor) -> None:
        """Keeps a detached copy of this iteration's agreement C when capturing."""
        if self.capture_agreement:
            self.agreement.append(agreement.detach())

    def route(self, capsules: Tensor, votes: Tensor) -> Tensor:
        """Routes the votes (T, B, L, N, d/N), in the model's precision, to fp32 output capsules (T, B, N, d/N),
        computing in fp32."""
        raise NotImplementedError
