"""Analytic multiply-add counts per target token, to bound each aggregator's slowdown."""

from dataclasses import dataclass


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


def aggregator_macs(name: str, d: int, layers: int, capsules: int, iters: int = 3, ffn: int = 0,
                    rank: int = 0) -> float:
    """Multiply-adds of one aggregator per position."""
    if name in ("none", "baseline"):
        return 0.0
    if name == "linear":
        return layers * d
    if name == "dynamic":
        ffn = ffn or d
        return layers * d * layers * ffn + layers * ffn * d + layers * d
    inputs = 2 * layers * d * rank if rank else (layers * d) ** 2
    votes = layers * d * d
    routing = iters * 3 * layers * d  # weighted sums and agreement products over L x N x d/N
    extra = layers * d if name == "em-routing" else 0
    return inputs + votes + routing + extra


def flop_bound(baseline: float, added: float) -> float:
    """The best possible speed ratio to the baseline when time is proportional to FLOPs."""
    return baseline / (baseline + added)
