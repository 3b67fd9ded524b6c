"""examples/gpu_check.sh, the one command for a GPU machine without network: its steps in order, each under its
own time limit, with flags the test runner and the benchmark accept (the GPU run itself needs a device)."""

import shlex
import subprocess

from helpers import ROOT


def test_the_gpu_check_runs_the_cuda_tests_then_the_bf16_benchmark(tmp_path, monkeypatch):
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": str(python), "OUT": str(tmp_path / "out"),
           "WHEELS_DIR": str(tmp_path / "no-wheels")}
    result = subprocess.run(["bash", str(ROOT / "examples" / "gpu_check.sh")], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    tests, benchmark = calls.read_text().splitlines()
    assert tests.startswith("-m pytest") and tests.endswith("tests/unit/test_cuda.py tests/unit/kernels")
    assert all((ROOT / path).exists() for path in tests.split() if path.startswith("tests/"))  # the tests it names
    assert benchmark.startswith("benchmarks/speed.py")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import speed

    args = speed.build_parser().parse_args(shlex.split(benchmark)[1:])
    assert (args.device, args.shapes, args.bf16, args.tokens, args.repeats, args.name) == (
        "cuda", ["base"], True, 16384, 2, "speed-gpu-bf16")
    assert args.output_dir == str(tmp_path / "out") and args.systems == list(speed.SYSTEMS)
    log = (tmp_path / "out" / "gpu-check.log").read_text()
    assert "[gpu-check] CUDA tests" in log and "[gpu-check] speed, bf16, base" in log
