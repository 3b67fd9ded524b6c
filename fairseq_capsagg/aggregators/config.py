"""Hyper-parameters shared by every layer aggregator, and their validation."""

from dataclasses import dataclass
from typing import Any, Optional

AGGREGATION_CHOICES = ("none", "linear", "dynamic", "dynamic-routing", "em-routing")
ROUTING_CHOICES = ("dynamic-routing", "em-routing")
ROUTING_INIT_CHOICES = ("random", "identity")
CAPSULE_INPUT_CHOICES = ("all", "layer")
LINEAR_WEIGHT_CHOICES = ("vector", "matrix")


class AggregationConfigError(ValueError):
    """A bad aggregation setting; the message names the flag and its allowed values."""


@dataclass
class AggregationConfig:
    """Settings of one aggregator (encoder and decoder share them).

    Attributes:
        output_capsules: N, the number of output capsules of width d/N
            (``--output-capsules``); ``None`` means N = d (scalar capsules,
            as in the paper's agreement analysis).
        routing_iters: T, the routing iterations (``--routing-iters``).
        capsule_input: ``all`` builds input capsules with F_l(H^1..H^L)
            (Eq. 9), ``layer`` with F_l(H^l) (the Table 4 ablation).
        ffn_dim: hidden width of the per-layer FFN_l of dynamic combination
            (Eq. 4); ``None`` means d.
        linear_weights: shape of the static W_l of Eq. 3, ``vector``
            (W_l in R^d, element-wise) or ``matrix`` (W_l in R^{d x d}).
        em_inverse_temperature: the final inverse temperature lambda of EM
            routing (Eq. 15); iteration t of T uses lambda * t / T.
        capsule_rank: 0 for the paper's F_l; r > 0 factorises the F_l of
            ``capsule_input='all'`` through a shared rank-r bottleneck.
        compile_routing: run the routing iterations through ``torch.compile``.
        routing_init: ``random`` (every F_l and W_{l->n} Glorot-uniform by its own
            fan-in and fan-out) or ``identity`` (input capsules and votes carry H^L,
            so the routed output starts close to the top layer; routing only).
    """

    output_capsules: Optional[int] = None
    routing_iters: int = 3
    capsule_input: str = "all"
    ffn_dim: Optional[int] = None
    linear_weights: str = "vector"
    em_inverse_temperature: float = 1.0
    capsule_rank: int = 0
    compile_routing: bool = False
    routing_init: str = "random"

    @classmethod
    def from_args(cls, args: Any) -> "AggregationConfig":
        """Reads the ``--output-capsules`` ... flags from a fairseq namespace."""
        return cls(
            output_capsules=getattr(args, "output_capsules", None),
            routing_iters=getattr(args, "routing_iters", 3),
            capsule_input=getattr(args, "capsule_input", "all"),
            ffn_dim=getattr(args, "aggregation_ffn_dim", None),
            linear_weights=getattr(args, "linear_combination_weights", "vector"),
            em_inverse_temperature=getattr(args, "em_inverse_temperature", 1.0),
            capsule_rank=getattr(args, "capsule_rank", 0) or 0,
            compile_routing=bool(getattr(args, "compile_routing", False)),
            routing_init=getattr(args, "routing_init", "random") or "random",
        )

    def num_output_capsules(self, embed_dim: int) -> int:
        return embed_dim if self.output_capsules is None else self.output_capsules

    def validate(self, name: str, embed_dim: int, num_layers: int, side: str = "") -> None:
        """Raises :class:`AggregationConfigError` for settings that cannot work.

        Args:
            name: the aggregation name.
            embed_dim: d, the width of every layer output.
            num_layers: L, the number of layer outputs that are aggregated.
            side: ``encoder`` or ``decoder``, used to name the flag.
        """
        flag = f"--{side}-aggregation" if side else "aggregation"
        if name not in AGGREGATION_CHOICES:
            raise AggregationConfigError(
                f"{flag}: unknown aggregation {name!r}; "
                f"choose one of {', '.join(AGGREGATION_CHOICES)}"
            )
        if name == "none":
            return
        if num_layers < 2:
            raise AggregationConfigError(
                f"{flag} {name}: needs at least 2 layer outputs to aggregate, got "
                f"{num_layers}; use more --{side or 'encoder'}-layers, "
                "--aggregate-embedding, or 'none'"
            )
        if name == "linear" and self.linear_weights not in LINEAR_WEIGHT_CHOICES:
            raise AggregationConfigError(
                f"--linear-combination-weights: got {self.linear_weights!r}; "
                f"choose one of {', '.join(LINEAR_WEIGHT_CHOICES)}"
            )
        if name == "dynamic" and self.ffn_dim is not None and self.ffn_dim < 1:
            raise AggregationConfigError(
                f"--aggregation-ffn-dim: got {self.ffn_dim}; it must be a positive integer"
            )
        if name in ROUTING_CHOICES:
            n = self.num_output_capsules(embed_dim)
            if n < 1 or embed_dim % n != 0:
                divisors = [k for k in range(1, embed_dim + 1) if embed_dim % k == 0]
                raise AggregationConfigError(
                    f"--output-capsules: got {n}, but it must be a positive divisor of the "
                    f"model dimension {embed_dim} (allowed: {', '.join(map(str, divisors))})"
                )
            if self.routing_iters < 1:
                raise AggregationConfigError(
                    f"--routing-iters: got {self.routing_iters}; it must be an integer >= 1"
                )
            if self.capsule_input not in CAPSULE_INPUT_CHOICES:
                raise AggregationConfigError(
                    f"--capsule-input: got {self.capsule_input!r}; "
                    f"choose one of {', '.join(CAPSULE_INPUT_CHOICES)}"
                )
            if self.capsule_rank < 0:
                raise AggregationConfigError(
                    f"--capsule-rank: got {self.capsule_rank}; use 0 (the paper's F_l) or a "
                    "positive bottleneck width"
                )
            if self.capsule_rank > 0 and self.capsule_input != "all":
                raise AggregationConfigError(
                    "--capsule-rank factorises F_l(H^1..H^L) and needs --capsule-input all, "
                    f"not {self.capsule_input!r}"
                )
            if self.routing_init not in ROUTING_INIT_CHOICES:
                raise AggregationConfigError(
                    f"--routing-init: got {self.routing_init!r}; choose one of {', '.join(ROUTING_INIT_CHOICES)}"
                )
            if self.routing_init == "identity" and (self.capsule_input != "all" or self.capsule_rank > 0):
                raise AggregationConfigError(
                    "--routing-init identity needs the full input-capsule maps F_l(H^1..H^L) "
                    "(--capsule-input all, --capsule-rank 0): F_l(H^l) cannot see H^L, and a rank-r "
                    "bottleneck cannot carry it; use --routing-init random with these settings"
                )
            if name == "em-routing" and not self.em_inverse_temperature > 0:
                raise AggregationConfigError(
                    f"--em-inverse-temperature: got {self.em_inverse_temperature}; "
                    "it must be > 0"
                )
