"""Fixtures and markers of the suite (shared code lives in helpers.py)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers import TINY_CORPUS, run_tool  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: trainings, SIGKILL, DDP and main-job runs (`make test-fast` skips them)")


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
