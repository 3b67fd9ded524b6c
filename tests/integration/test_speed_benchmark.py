"""The speed benchmark end to end: every system timed in its own process, ratios written (no timing
asserted)."""

import argparse
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
    # MUDD's connections add kernels to every step; the counts are deterministic, so the two rounds agree
    assert rows[1]["train_kernels_ratio"] > 1.1 and rows[1]["decode_kernels_ratio"] > 1.1
    assert rows[1]["train_kernels_ratio_range"][0] == rows[1]["train_kernels_ratio_range"][1]
    assert "| small | mudd |" in (tmp_path / "speed.md").read_text()


def test_count_only_writes_kernels_and_memory_per_step_under_its_name(tmp_path):
    """--count-only: no timing, the kernels per training and decoding step, the bytes they move and the step's memory
    against the baseline's, in seconds; mHC's fused read, Sinkhorn and write count one kernel each way where the eager
    references launch hundreds a block."""
    common = [sys.executable, str(ROOT / "benchmarks" / "speed.py"), "--count-only", "--shapes", "small",
              "--systems", "baseline", "mhc", "--tokens", "64", "--length", "8", "--decode-sentences", "2",
              "--vocab", "500", "--output-dir", str(tmp_path)]
    for name, kernel in (("fused", "fused"), ("eager", "eager")):
        result = subprocess.run([*common, "--name", name, f"--model-args=--connection-kernels {kernel}"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    fused, eager = (json.loads((tmp_path / f"{name}.json").read_text())["rows"] for name in ("fused", "eager"))
    assert "train_tokens_per_s" not in fused[1] and fused[0]["train_kernels_ratio"] == 1.0
    assert fused[0]["train_kernels"] == eager[0]["train_kernels"]  # the Transformer has no Sinkhorn
    assert eager[1]["train_kernels"] - fused[1]["train_kernels"] > 3000
    # the step's memory is counted too: mHC's four streams hold more than one residual stream, more so eager
    assert fused[0]["train_step_peak_bytes"] == eager[0]["train_step_peak_bytes"]
    assert 1 < fused[1]["train_step_peak_bytes_ratio"] < eager[1]["train_step_peak_bytes_ratio"]
    # and the bytes its operators move: the eager Sinkhorn's iterations read and write every H_res many times
    assert fused[0]["train_bytes_moved"] == eager[0]["train_bytes_moved"]
    assert 1 < fused[1]["train_bytes_moved_ratio"] < eager[1]["train_bytes_moved_ratio"]
    assert "kernels per train step" in (tmp_path / "fused.md").read_text()
    assert "| step memory | ratio |" in (tmp_path / "fused.md").read_text()
    assert "| traffic per train step | ratio |" in (tmp_path / "fused.md").read_text()


def test_tables_written_after_each_measurement_list_what_is_pending(tmp_path, monkeypatch):
    """A run stopped by a time limit (the device tool's) keeps its measurements: after every child the
    tables hold the systems measured so far, paired with the reference of their round, and name the rest."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import speed

    def measured(tokens_per_s: float) -> dict:
        return {"params": 1e6, "train_kernels": 100, "decode_kernels": 10, "train_bytes_moved": 2**30,
                "train_steps_per_s": 1.0, "train_tokens_per_s": tokens_per_s, "decode_sentences_per_s": 2.0,
                "peak_memory_bytes": 2**20}

    args = argparse.Namespace(
        shapes=["small"], systems=["baseline", "mudd", "hc"], repeats=2, vocab=500, length=8, tokens=128, beam=4,
        capsule_rank=0, device="cpu", threads=2, output_dir=str(tmp_path), name="speed", bf16=False, model_args="",
        count_only=False)
    runs = {("small", "baseline"): [measured(100.0), measured(200.0)],
            ("small", "mudd"): [measured(50.0), measured(180.0)], ("small", "hc"): []}
    speed.write_tables(args, runs)
    payload = json.loads((tmp_path / "speed.json").read_text())
    assert [r["system"] for r in payload["rows"]] == ["baseline", "mudd"]
    mudd = payload["rows"][1]
    assert mudd["train_tokens_per_s_ratio_range"] == [0.5, 0.9]  # each round against its own baseline
    assert payload["pending"] == ["small hc (0 of 2 rounds)"]
    assert "Pending (not measured yet, or fewer rounds than asked): small hc (0 of 2 rounds)." in \
        (tmp_path / "speed.md").read_text()

    runs[("small", "baseline")].append(measured(300.0))  # a third round's reference only: nothing to pair with
    args.repeats = 3
    speed.write_tables(args, runs)
    payload = json.loads((tmp_path / "speed.json").read_text())
    assert payload["rows"][1]["repeats"] == 2 and "small mudd (2 of 3 rounds)" in payload["pending"]
