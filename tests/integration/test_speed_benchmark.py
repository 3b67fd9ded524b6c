"""The speed benchmark end to end: every system timed in its own process, ratios written (no timing
asserted)."""

import json
import subprocess
import sys

from helpers import ROOT


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
