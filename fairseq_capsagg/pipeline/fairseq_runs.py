"""Runs fairseq's console scripts (fairseq-generate inside the driver's own process), shows their progress and
reads their logs."""

import contextlib
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from fairseq import options
from fairseq_cli import generate as fairseq_generate

from ..user_dir import USER_DIR
from ..aggregators import families, family_class
from ..models import SMALL_SHAPE, shape_flags

BIN = Path(sys.executable).parent
BASELINE_ARCHS = {"base": "transformer_wmt_en_de", "big": "transformer_vaswani_wmt_en_de_big"}
BASELINE = "baseline"


class ToolFailed(RuntimeError):
    """A fairseq console script exited with an error, or ended without doing its job."""


def systems() -> List[str]:
    """The systems a job can train: the baseline, then every aggregator family."""
    return [BASELINE, *families()]


def paper_systems() -> List[str]:
    """The baseline and the families that aggregate at the stack's output (Table 1 of Dou et al.)."""
    return [s for s in systems() if s == BASELINE or family_class(s).architecture_placement == "output"]


def peer_systems() -> List[str]:
    """The families whose architectures connect every block densely (the peers of routing)."""
    return [s for s in systems() if s not in paper_systems()]


def label(system: str) -> str:
    """The system's name in tables, as the paper's Table 1 writes it."""
    return "Transformer" if system == BASELINE else f"+ {family_class(system).label}"


def warm_start_flags(system: str) -> List[str]:
    """Flags that make a fresh aggregator of ``system`` start as the Transformer (warm starts)."""
    return [] if system == BASELINE else list(family_class(system).warm_start_flags)


#: Updates over which a continued aggregator at the stack's output ramps in from H^L (README, "Continuing a trained
#: Transformer"): the default of every driver that continues a trained Transformer.
RAMP_UPDATES = 200


def continuation_flags(system: str, ramp_updates: int) -> List[str]:
    """Flags that continue a trained Transformer with ``system`` (the paper's protocol): where its architecture
    aggregates at the stack's output (the paper's aggregators), the ramp from H^L to the aggregate over
    ``ramp_updates``, and its :func:`warm_start_flags` (the connections between blocks start as the Transformer
    without a ramp)."""
    if system == BASELINE:
        return []
    ramp = ["--aggregation-ramp-updates", str(ramp_updates)] if system in paper_systems() else []
    return ramp + warm_start_flags(system)


def tool_command(tool: str) -> List[str]:
    """How to run one of fairseq's console scripts (``fairseq-train``): the script beside this Python, or,
    where fairseq was installed without its scripts there (``pip install --target``, as on a lent GPU
    machine), the module the script calls (``python -m fairseq_cli.train``)."""
    script = BIN / tool
    return [str(script)] if script.exists() else [sys.executable, "-m", f"fairseq_cli.{tool.removeprefix('fairseq-')}"]


def run_logged(tool: str, args: Sequence[str], log: Path, stdout_file: Optional[Path] = None) -> float:
    """Runs ``tool`` (:func:`tool_command`), echoing its output and keeping it in ``log``; returns wall seconds.

    With ``stdout_file`` the tool's standard output goes there instead (the
    hypotheses of fairseq-generate) and only its standard error is echoed.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.time()
    with open(log, "w", encoding="utf-8", buffering=1) as log_f:  # line-buffered: the log shows progress
        out_f = open(stdout_file, "w", encoding="utf-8") if stdout_file else None
        try:
            proc = subprocess.Popen([*tool_command(tool), *args], stdout=out_f or subprocess.PIPE,
                                    stderr=subprocess.STDOUT if out_f is None else subprocess.PIPE,
                                    text=True, env=env)
            for line in proc.stdout if out_f is None else proc.stderr:
                sys.stdout.write("    " + line)
                log_f.write(line)
            code = proc.wait()
        finally:
            if out_f:
                out_f.close()
    if code != 0:
        raise ToolFailed(f"{tool} failed with exit code {code}; its log is {log}")
    return time.time() - start


#: fairseq's log line, as its console scripts configure it.
LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


@contextlib.contextmanager
def logged_to(log: Path) -> Iterator[None]:
    """While it lasts, the log lines and the standard error of this process go to ``log``, and the log lines,
    indented, to standard output too (as :func:`run_logged` keeps and shows a console script's), instead of to
    its own handlers, which it then restores."""
    root = logging.getLogger()
    with open(log, "w", encoding="utf-8", buffering=1) as log_f, contextlib.redirect_stderr(log_f):
        to_file, echo = logging.StreamHandler(log_f), logging.StreamHandler(sys.stdout)
        to_file.setFormatter(logging.Formatter(LOG_FORMAT, LOG_DATE_FORMAT))
        echo.setFormatter(logging.Formatter("    " + LOG_FORMAT, LOG_DATE_FORMAT))
        saved, level = root.handlers[:], root.level
        root.handlers, root.level = [to_file, echo], min(level, logging.INFO)
        try:
            yield
        finally:
            root.handlers, root.level = saved, level


def run_generate(args: Sequence[str], log: Path, hyp_file: Path) -> None:
    """``fairseq-generate ARGS`` inside this process, as its console script runs it (``fairseq_cli.generate``
    on the same parsed arguments, with ``--log-format simple`` as when its standard error is no terminal): its
    standard output (``S-``/``H-``/``D-`` lines) into ``hyp_file``, its log into ``log``.

    A driver decodes every row several times (the best checkpoint, the average, the references' scores, the
    length penalty's validation n-best, the tuned penalty), and a ``fairseq-generate`` process spends seconds
    importing torch, fairseq and every criterion fairseq registers (scikit-learn's among them) before it reads
    a sentence: on 2 CPU cores, most of a quick decoding. The driver has imported them already.

    Raises:
        ToolFailed: fairseq stopped with an error or refused an argument (its traceback is in ``log``).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    parser = options.get_generation_parser()
    parser.prog = "fairseq-generate"
    # as the console script does (fairseq_cli/generate.py, cli_main), for the tasks that read a model's flags
    parser.add_argument("--arch", "-a", metavar="ARCH", default="wav2vec2")
    with logged_to(log), open(hyp_file, "w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
        try:
            fairseq_generate.main(options.parse_args_and_arch(parser, [*args, "--log-format", "simple"]))
        except SystemExit as refusal:  # argparse's, its message in the log
            raise ToolFailed(f"fairseq-generate refused its arguments (exit code {refusal.code}); its log is {log}") \
                from None
        except Exception as error:
            logging.getLogger(__name__).error("fairseq-generate failed:\n%s", traceback.format_exc())
            raise ToolFailed(f"fairseq-generate failed ({type(error).__name__}: {error}); its log is {log}") \
                from error


def arch_flags(system: str, shape: str) -> List[str]:
    """The baseline is fairseq's own ``transformer`` (so its checkpoints are vanilla).

    ``--user-dir`` is passed for every system: besides the architectures it
    allow-lists the globals fairseq checkpoints need under torch's safe loading.
    """
    if system == "baseline":
        arch = ["--arch", "transformer", *shape_flags(SMALL_SHAPE)] if shape == "small" \
            else ["--arch", BASELINE_ARCHS[shape]]
    else:
        arch = ["--arch", f"transformer_{system}_{shape}"]
    return ["--user-dir", USER_DIR, *arch]


#: fairseq's ``--warmup-init-lr`` of the inverse square-root schedule (training from scratch).
WARMUP_INIT_LR = 1e-7


def schedule_flags(hparams: Dict[str, object]) -> List[str]:
    """The learning-rate schedule: fairseq's ``inverse_sqrt`` (linear warm-up over
    ``hparams["warmup"]`` updates, then decay with the inverse square root of the update), or with
    ``hparams["schedule"] == "fixed"`` a constant ``lr`` after the same linear warm-up (continuing a
    trained model at the rate it ended with)."""
    if hparams.get("schedule", "inverse_sqrt") == "fixed":
        return ["--lr-scheduler", "fixed", "--warmup-updates", str(hparams["warmup"])]
    return ["--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(hparams["warmup"]),
            "--warmup-init-lr", f"{WARMUP_INIT_LR:g}"]


def inverse_sqrt_lr(update: int, lr: float, warmup: int) -> float:
    """The learning rate of :func:`schedule_flags`' ``inverse_sqrt`` schedule after ``update`` updates
    (fairseq's ``InverseSquareRootSchedule.step_update``)."""
    if update < warmup:
        return WARMUP_INIT_LR + update * (lr - WARMUP_INIT_LR) / warmup
    return lr * math.sqrt(warmup / update)


def train(data_bin: Path, save_dir: Path, system: str, shape: str, max_update: int,
          hparams: Dict[str, object], log: Path, extra: Sequence[str] = ()) -> float:
    """Trains (or resumes) one system until ``max_update``; returns wall seconds."""
    args = [
        str(data_bin), *arch_flags(system, shape), "--task", "translation",
        "--source-lang", hparams["pair"][0], "--target-lang", hparams["pair"][1], "--share-all-embeddings",
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
        "--lr", str(hparams["lr"]), *schedule_flags(hparams),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--dropout", "0.1", "--max-tokens", str(hparams["max_tokens"]),
        "--max-update", str(max_update), "--seed", str(hparams["seed"]),
        "--save-dir", str(save_dir), "--no-epoch-checkpoints",
        "--save-interval-updates", str(hparams.get("save_interval_updates", 0)), "--keep-interval-updates", "1",
        "--log-format", "simple", "--log-interval", str(hparams["log_interval"]),
        "--num-workers", "0", *hparams["device_flags"], *extra,
    ]
    return run_logged("fairseq-train", args, log)


#: fairseq's default ``--required-batch-size-multiple``: a split's last, longest batch smaller than it is left
#: out (fairseq issue #5036), which training's validation keeps and :func:`generate` turns off.
FAIRSEQ_BATCH_MULTIPLE = 8


def generate_args(data_bin: Path, checkpoint: Path, hparams: Dict[str, object], subset: str = "test") -> List[str]:
    """``fairseq-generate``'s arguments for a beam-search decoding of ``subset`` with ``hparams``
    (``hparams["lenpen"]``, when given, is fairseq's ``--lenpen``; otherwise fairseq's default).

    Every sentence is decoded: fairseq drops the last batch of a split when its size is not a multiple
    of ``--required-batch-size-multiple`` (8 by default; fairseq issue #5036), and batches are ordered
    by length, so at the default the longest sentences would go untranslated (the three longest of the
    bundled En->De test split).
    """
    args = [str(data_bin), "--path", str(checkpoint), "--gen-subset", subset, "--task", "translation",
            "--source-lang", hparams["pair"][0], "--target-lang", hparams["pair"][1], "--beam", str(hparams["beam"]),
            "--batch-size", str(hparams["decode_batch"]), "--remove-bpe", hparams["remove_bpe"],
            "--max-len-a", str(hparams["max_len"][0]), "--max-len-b", str(hparams["max_len"][1]),
            "--max-source-positions", "1024", "--max-target-positions", "1024", "--skip-invalid-size-inputs-valid-test",
            "--required-batch-size-multiple", "1", "--user-dir", USER_DIR, *hparams["device_flags"]]
    return args + (["--lenpen", str(hparams["lenpen"])] if "lenpen" in hparams else [])


def generate(data_bin: Path, checkpoint: Path, hyp_file: Path, log: Path,
             hparams: Dict[str, object], subset: str = "test", extra: Sequence[str] = ()) -> float:
    """Beam-search decoding of ``subset`` (:func:`generate_args`, with ``extra``: more ``fairseq-generate``
    flags, ``--score-reference``) in this process (:func:`run_generate`); returns sentences per second as
    fairseq reports it."""
    run_generate([*generate_args(data_bin, checkpoint, hparams, subset), *extra], log, hyp_file)
    match = re.search(r"\(([0-9.]+) sentences/s", hyp_file.read_text(encoding="utf-8") + log.read_text())
    if not match:
        raise RuntimeError(f"fairseq-generate printed no speed line; see {log}")
    return float(match.group(1))


def continue_from(source_dir: Path, target_dir: Path) -> None:
    """Starts ``target_dir`` from ``source_dir``'s last checkpoint (to train it longer)."""
    target_dir.mkdir(parents=True, exist_ok=True)
    if not (target_dir / "checkpoint_last.pt").exists():
        shutil.copy2(source_dir / "checkpoint_last.pt", target_dir / "checkpoint_last.pt")
