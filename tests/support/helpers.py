"""What the tests share: paths, console-script runs, tiny models and batches."""

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Sequence

import torch
from fairseq.data import Dictionary

from fairseq_capsagg import USER_DIR
from fairseq_capsagg.aggregators import families
from fairseq_capsagg.models.build import build_model, joined_dictionary, model_args

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = Path(__file__).resolve().parent
TINY_CORPUS = ROOT / "examples" / "data" / "tiny-ende"
BIN = Path(sys.executable).parent
MAIN_JOB = ROOT / "examples" / "main_job.py"
TABLE1 = ROOT / "examples" / "table1.py"

#: Two logged stretches and validations of a ``fairseq-train`` run (updates 10 and 20), as fairseq writes them.
TRAIN_LOG = """\
2026-11-27 08:38:59 | INFO | train_inner | epoch 001:     10 / 51 loss=9.934, nll_loss=9.858, ppl=928.24, wps=224.6, ups=0.17, wpb=1331.9, bsz=52.8, num_updates=10, lr=0.002, gnorm=1.337, clip=60, train_wall=59, wall=60
2026-11-27 08:39:04 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.336 | nll_loss 9.201 | ppl 588.37 | wps 442.9 | wpb 1146 | bsz 28 | num_updates 10
2026-11-27 08:39:55 | INFO | train_inner | epoch 001:     20 / 51 loss=8.973, nll_loss=8.769, ppl=436.18, wps=246.3, ups=0.18, wpb=1386.7, bsz=44.8, num_updates=20, lr=1.41421e-03, gnorm=0.465, clip=0, train_wall=51, wall=116
2026-11-27 08:40:01 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 9.066 | nll_loss 8.837 | ppl 457.46 | wps 410 | wpb 1146 | bsz 28 | num_updates 20 | best_loss 9.066
"""

#: Every ``transformer_{family}_{shape}`` family.
FAMILIES = list(families())

#: The tiny shape of fairseq's own ``transformer`` (``VANILLA_TINY``) and of the plugin's models (``TINY``).
VANILLA_TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                "--decoder-ffn-embed-dim", "64", "--encoder-layers", "3", "--decoder-layers", "3"]
TINY = [*VANILLA_TINY, "--output-capsules", "8"]


def tool_threads() -> str:
    """Threads of every process the tests start: ``OMP_NUM_THREADS`` when set (``make test`` runs two
    test workers with one thread each, so that no process waits on a core another one spins on),
    else 2 (the machine's cores)."""
    return os.environ.get("OMP_NUM_THREADS", "2")


def run_tool(tool: str, *args: str, stdin: str = None, check: bool = True, timeout: int = 300):
    """Runs a console script of this environment (fairseq-train, ...) and returns the result."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=tool_threads())
    result = subprocess.run([str(BIN / tool), *args], input=stdin, capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def run_driver(script: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs an experiment driver as a user would, from a checkout; with ``check`` a failure raises
    with the end of its output."""
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900,
                            env=dict(os.environ, OMP_NUM_THREADS=tool_threads()))
    if check and result.returncode != 0:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-3000:])
    return result


def main_job(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``examples/main_job.py`` with ``args``."""
    return run_driver(MAIN_JOB, *args, check=check)


def table1(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``examples/table1.py`` with ``args``."""
    return run_driver(TABLE1, *args, check=check)


def train(data, save_dir, arch, *extra, shape=TINY):
    """Three updates of ``arch`` at the tiny ``shape`` through ``fairseq-train``."""
    return run_tool(
        "fairseq-train", str(data), "--user-dir", USER_DIR, "--arch", arch, *shape,
        "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--cpu",
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000", "--max-update", "3",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--log-format", "simple",
        "--log-interval", "1", "--seed", "1", "--num-workers", "0", *extra,  # later flags win
    )


#: The tiny shape of the models built in-process (``build_tiny_model``).
TINY_SHAPE = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--encoder-layers", "3", "--decoder-layers", "3", "--output-capsules", "4",
]


def tiny_dictionary(size: int = 20) -> Dictionary:
    """A dictionary of fairseq's special symbols and ``size`` words."""
    return joined_dictionary(size + len(Dictionary()))


def parse_model_args(arch: str, extra: Sequence[str] = ()):
    return model_args(arch, [*TINY_SHAPE, *extra], data="unused-data")


def build_tiny_model(arch: str, extra: Sequence[str] = (), seed: int = 0, dictionary: Dictionary = None):
    """Returns (model, dictionary) for ``arch`` at a tiny shape, in eval mode."""
    torch.manual_seed(seed)
    dictionary = dictionary or tiny_dictionary()
    return build_model(parse_model_args(arch, extra), dictionary).eval(), dictionary


def random_tokens(dictionary: Dictionary, lengths: List[int], seed: int = 0, bos: bool = False):
    """Right-padded (B, T) tokens; sentences end with EOS (or start with it when ``bos``)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    tokens = torch.full((len(lengths), width), dictionary.pad())
    for i, n in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        end = torch.tensor([dictionary.eos()])
        tokens[i, :n] = torch.cat([end, body]) if bos else torch.cat([body, end])
    return tokens


def fixed_batch_logits(model, dictionary: Dictionary) -> torch.Tensor:
    """The model's logits on one fixed batch (sources of 6 and 3 tokens, 5 previous target tokens)."""
    src = random_tokens(dictionary, [6, 3], seed=5)
    prev = random_tokens(dictionary, [5, 5], seed=6, bos=True)
    with torch.no_grad():
        return model(src, src.ne(dictionary.pad()).sum(1), prev)[0]
