"""What every experiment driver shares: the flags of a training setup (one default each), the one
``--quick`` mode, fairseq's hyper-parameters built from them, and the work directory with its stages."""

import argparse
import fcntl
import json
import os
import time
from pathlib import Path
from typing import Dict, Sequence

from ..models import SHAPES

#: ``--quick``, one mode for the main job and Table 1: minutes on 2 CPU cores, to try the pipeline end
#: to end and for its tests; nothing it learns is meant to be read. The sentences kept of each split, the
#: settings it fixes (each driver takes those of its flags), fairseq's --log-interval, and the longest
#: hypothesis (a model of 20 updates rarely ends one, so its beams ran to the full-size limit: 83 of the
#: 131 seconds of a quick Zh->En converged run, whose sources are characters, went into decoding).
QUICK_LIMITS = {"train": 3000, "valid": 60, "test": 60}
QUICK = {"vocab_size": 1000, "max_update": 20, "warmup": 5, "max_tokens": 1024, "beam": 2, "warm_updates": 10,
         "ramp_updates": 5, "validate_interval_updates": 5, "patience_updates": 10, "update_cap": 20}
QUICK_LOG_INTERVAL = 5
QUICK_MAX_LEN = (0.0, 32)

#: fairseq-generate's --max-len-a, --max-len-b of every decoding: hypotheses of at most 1.2 x the source's
#: length + 10 tokens.
MAX_LEN = (1.2, 10)


def apply_quick(args: argparse.Namespace) -> None:
    """Sets the :data:`QUICK` settings that ``args`` has as flags."""
    for key, value in QUICK.items():
        if hasattr(args, key):
            setattr(args, key, value)


def log_interval(args: argparse.Namespace) -> int:
    """fairseq's ``--log-interval``: every 50 updates, every :data:`QUICK_LOG_INTERVAL` with ``--quick``."""
    return QUICK_LOG_INTERVAL if args.quick else 50


def add_setup_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a training setup that the main job and Table 1 share, with their one default each."""
    parser.add_argument("--shape", choices=tuple(SHAPES), default="small",
                        help="the architectures' shape (default small)")
    parser.add_argument("--vocab-size", type=int, default=8000,
                        help="joint sentencepiece vocabulary (default 8000; subword-nmt: the merges)")
    parser.add_argument("--max-train-tokens", type=int, default=64,
                        help="drop training pairs longer than this many subwords on either side (default 64)")
    parser.add_argument("--max-update", type=int, default=900, help="updates of every from-scratch row (default 900)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per update (default 4096)")
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate, inverse square root (default 2e-3)")
    parser.add_argument("--warmup", type=int, default=200, help="warm-up updates (default 200)")
    parser.add_argument("--beam", type=int, default=4, help="beam size of every decoding (default 4)")
    parser.add_argument("--model-args", default="",
                        help="extra fairseq-train flags of every aggregator system, e.g. '--routing-iters 2'")
    parser.add_argument("--gpu", action="store_true", help="train and decode on CUDA (default: CPU)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a few minutes: {QUICK_LIMITS['train']} training pairs, {QUICK_LIMITS['test']} test "
                             f"pairs, {QUICK['vocab_size']} subwords, {QUICK['max_update']} updates, beam {QUICK['beam']}, "
                             f"hypotheses of at most {QUICK_MAX_LEN[1]} tokens")


def hparams(args: argparse.Namespace, pair: Sequence[str], remove_bpe: str, **extra: object) -> Dict[str, object]:
    """fairseq's hyper-parameters of a setup (``fairseq_runs.train`` and ``generate`` read them)."""
    return {"lr": args.lr, "warmup": args.warmup, "max_tokens": args.max_tokens, "beam": args.beam,
            "decode_batch": 128 if args.gpu else 32, "log_interval": log_interval(args),
            "max_len": QUICK_MAX_LEN if args.quick else MAX_LEN,
            "device_flags": [] if args.gpu else ["--cpu"],
            "pair": tuple(pair), "remove_bpe": remove_bpe, **extra}


class WorkdirError(RuntimeError):
    """A work directory that a driver cannot use."""


class ConfigMismatch(WorkdirError):
    """A work directory holds results of another configuration."""


def check_workdir(workdir: Path, config: Dict[str, object]) -> None:
    """Refuses a work directory that holds results of another configuration."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "config.json"
    if path.exists():
        old = json.loads(path.read_text())
        diff = {k: (old.get(k), v) for k, v in config.items() if old.get(k) != v}
        if diff:
            changes = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in diff.items())
            raise ConfigMismatch(
                f"{workdir} holds results of another configuration ({changes}); "
                "nothing was changed. Use another --workdir, or rerun with the old settings.")
    else:
        path.write_text(json.dumps(config, indent=2))


class WorkdirBusy(WorkdirError):
    """Another process is running stages in the same work directory."""


class Stages:
    """Remembers finished stages (and what they measured) in workdir/stages.json.

    One process at a time owns a work directory (an exclusive lock on ``workdir/stages.lock``, released
    when the process ends): two writers of stages.json would each drop what the other recorded.
    """

    def __init__(self, workdir: Path, label: str = "main-job"):
        #: The driver's name, before every line it prints.
        self.label = label
        self._lock = open(workdir / "stages.lock", "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            owner = self._lock.read().strip() or "unknown"
            self._lock.close()
            raise WorkdirBusy(f"{workdir} is in use by another run (pid {owner}); wait for it to finish, or use "
                              "another --workdir") from None
        self._lock.truncate(0)
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        self.path = workdir / "stages.json"
        self.done: Dict[str, object] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def close(self) -> None:
        """Releases the work directory (as the process's end does)."""
        self._lock.close()

    def run(self, name: str, fn, *outputs: Path):
        if name in self.done and all(p.exists() for p in outputs):
            print(f"[{self.label}] {name}: done already, skipped", flush=True)
            return self.done[name]
        print(f"[{self.label}] {name} ...", flush=True)
        start = time.time()
        result = fn()
        self.done[name] = result
        self.path.write_text(json.dumps(self.done, indent=2))
        print(f"[{self.label}] {name}: finished in {time.time() - start:.0f}s", flush=True)
        return result


def open_workdir(workdir: Path, config: Dict[str, object], label: str = "main-job") -> Stages:
    """The stages of ``workdir`` for this process, once the work directory is checked to hold results of
    ``config`` only and no other run owns it; ``label``: the driver, as its lines name it.

    Raises:
        WorkdirError: :class:`ConfigMismatch` or :class:`WorkdirBusy`.
    """
    check_workdir(workdir, config)
    return Stages(workdir, label)
