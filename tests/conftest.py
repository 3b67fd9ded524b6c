import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_CORPUS = ROOT / "examples" / "data" / "tiny-ende"
BIN = Path(sys.executable).parent

sys.path.insert(0, str(Path(__file__).parent))


def run_tool(tool: str, *args: str, stdin: str = None, check: bool = True, timeout: int = 300):
    """Runs a console script of this environment (fairseq-train, ...) and returns the result."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2")
    result = subprocess.run([str(BIN / tool), *args], input=stdin, capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


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
