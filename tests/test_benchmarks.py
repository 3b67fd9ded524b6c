"""The speed benchmark runs end to end and its FLOP model adds up (no timing is asserted)."""

import json
import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from flops import Shape, aggregator_macs, flop_bound, transformer_macs  # noqa: E402


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


@pytest.mark.slow
def test_speed_benchmark_writes_ratios(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "speed.py"), "--shapes", "small", "--systems", "baseline",
         "mudd", "--repeats", "2", "--steps", "1", "--warmup", "1", "--tokens", "128", "--length", "8",
         "--decode-sentences", "2", "--vocab", "500", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "speed.json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["baseline", "mudd"]
    assert rows[0]["train_tokens_per_s_ratio"] == 1.0 and rows[0]["train_tokens_per_s_ratio_range"] == [1.0, 1.0]
    assert all(r["repeats"] == 2 for r in rows)
    low, high = rows[1]["train_tokens_per_s_ratio_range"]
    assert low <= rows[1]["train_tokens_per_s_ratio"] <= high
    assert rows[1]["params"] > rows[0]["params"] and 0 < rows[1]["flop_bound"] < 1
    assert "| small | mudd |" in (tmp_path / "speed.md").read_text()
