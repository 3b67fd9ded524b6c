"""The benchmarks' FLOP model adds up (benchmarks/flops.py)."""

from flops import Shape, aggregator_macs, flop_bound, transformer_macs


def test_flop_model():
    assert aggregator_macs("none", 512, 6, 512) == 0
    assert aggregator_macs("em-routing", 512, 6, 512) > aggregator_macs("dynamic-routing", 512, 6, 512)
    # factorising F_l through rank d cuts the input-capsule cost from L^2 d^2 to 2 L d^2
    full = aggregator_macs("em-routing", 512, 6, 512)
    low = aggregator_macs("em-routing", 512, 6, 512, rank=512)
    assert full - low == (6 * 512) ** 2 - 2 * 6 * 512 * 512
    base = transformer_macs(Shape(d=512, ffn=2048, layers=6, vocab=32000, src_len=25, tgt_len=25))
    assert 0.5 < flop_bound(base, 2 * full) < flop_bound(base, 2 * low) < 1.0


def test_flop_model_of_dense_connections():
    """Between blocks, one connection per block over all earlier outputs; the peers are cheap at base."""
    base = transformer_macs(Shape(d=512, ffn=2048, layers=6, vocab=32000, src_len=25, tgt_len=25))
    assert aggregator_macs("dwa", 512, 6, 512) == sum(n * 512 for n in range(2, 8))
    # MUDD: four streams after blocks 1-5 and one after the top block, hidden width streams x inputs
    mudd = sum(512 + 512 * 4 * n + 4 * n * 4 * n + 4 * n * 512 for n in range(2, 7)) + (512 + 512 * 7 + 7 * 7 + 7 * 512)
    assert aggregator_macs("mudd", 512, 6, 512) == mudd
    for name in ("dwa", "depth-attention", "mudd"):
        assert flop_bound(base, 2 * aggregator_macs(name, 512, 6, 512)) > 0.99, name
