"""Analytic multiply-add counts per target token, to bound each aggregator's slowdown."""

from dataclasses import dataclass
from typing import Optional

from fairseq_capsagg.aggregators import AGGREGATORS, validated_settings


@dataclass
class Shape:
    d: int
    ffn: int
    layers: int
    vocab: int
    src_len: float
    tgt_len: float


def transformer_macs(s: Shape) -> float:
    """Multiply-adds of one training token pair (source and target of equal count)."""
    ratio = s.src_len / s.tgt_len
    encoder = s.layers * (4 * s.d * s.d + 2 * s.d * s.ffn + 2 * s.src_len * s.d) * ratio
    decoder = s.layers * (4 * s.d * s.d + 2 * s.d * s.ffn + 2 * s.tgt_len * s.d  # self-attention + FFN
                          + 2 * s.d * s.d + 2 * s.d * s.d * ratio + 2 * s.src_len * s.d)  # cross-attention
    return encoder + decoder + s.d * s.vocab


def aggregator_macs(name: str, d: int, layers: int, capsules: int, iters: Optional[int] = None, ffn: int = 0,
                    rank: int = 0) -> float:
    """Multiply-adds per position of aggregator ``name`` placed as in its architectures (at the
    stack's output over ``layers`` layers, or after each of ``layers`` blocks), as the aggregator
    declares them (``iters``: the routing iterations, by default the aggregator's own default)."""
    cls = AGGREGATORS[name]
    settings = validated_settings(cls, {"output_capsules": capsules, "routing_iters": iters,
                                        "aggregation_ffn_dim": ffn or None, "capsule_rank": rank}, d)
    if cls.architecture_placement == "between-blocks":
        return cls.between_blocks_multiply_adds(d, layers, settings)
    return cls.multiply_adds(d, layers, settings)


def flop_bound(baseline: float, added: float) -> float:
    """The best possible speed ratio to the baseline when time is proportional to FLOPs."""
    return baseline / (baseline + added)
