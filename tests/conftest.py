"""Fixtures and markers of the suite: shared code lives in support/; every test under integration/
(trainings, console scripts, other processes, the Triton compiler, whole models through Triton's interpreter) is
marked slow, every test under unit/ is not."""

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton's kernels run in its interpreter here (read when Triton is imported)
    os.environ.setdefault("TRITON_INTERPRET", "1")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "support"))
sys.path.insert(0, str(HERE.parent / "benchmarks"))  # the FLOP model of benchmarks/flops.py

from helpers import TINY_CORPUS, run_tool  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: tests under tests/integration (`make test-fast` runs tests/unit only)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE / "integration" in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny_data_bin(tmp_path_factory):
    """The tiny real corpus binarised with a joined word-level dictionary."""
    dest = tmp_path_factory.mktemp("tiny-bin")
    run_tool(
        "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
        "--trainpref", str(TINY_CORPUS / "train"), "--validpref", str(TINY_CORPUS / "valid"),
        "--testpref", str(TINY_CORPUS / "test"), "--joined-dictionary", "--destdir", str(dest),
        "--workers", "1",
    )
    return dest
