"""Faults a long training run meets: SIGKILL at any moment, checkpoint writes interrupted.

Inputs and faults tried here and in the other suites are listed in docs/reliability.md.
"""

import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from fairseq_capsagg import USER_DIR
from fairseq_capsagg.patches.durable_checkpoints import atomic_copy
from helpers import BIN, SUPPORT, TINY


#: Past the first epoch of the tiny corpus (18 batches of 300 tokens): the last kill comes in the second epoch.
UPDATES = 24
ARGS = ["--user-dir", USER_DIR, "--arch", "transformer_emrouting_small", *TINY, "--task", "translation",
        "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300", "--max-update", str(UPDATES),
        "--save-interval-updates", "2", "--keep-interval-updates", "2", "--no-epoch-checkpoints",
        "--num-workers", "0", "--seed", "2", "--log-format", "simple", "--log-interval", "1"]


def start(data, save_dir, stall=None, marker=None):
    """Starts fairseq-train; with ``stall=(phase, n)`` its n-th checkpoint save or copy hangs half-way."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    command = [str(BIN / "fairseq-train")]
    if stall:
        env.update(STALL_PHASE=stall[0], STALL_AT=str(stall[1]), STALL_MARKER=str(marker))
        command = [sys.executable, str(SUPPORT / "stalled_io_train.py")]
    return subprocess.Popen([*command, str(data), *ARGS, "--save-dir", str(save_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def kill_when(proc, condition, timeout=240.0):
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None and time.time() < deadline, "the moment to kill never came"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def assert_checkpoints_whole(save_dir):
    for checkpoint in save_dir.glob("*.pt"):
        torch.load(checkpoint, map_location="cpu", weights_only=True)  # raises on a truncated file


def test_sigkill_at_any_moment_then_restart_finishes_the_same_network(tiny_data_bin, tmp_path):
    save_dir = tmp_path / "ckpt"
    marker = tmp_path / "stalled"
    faults = [("save", 2), ("copy", 3), ("save", 5)]  # mid-write of a checkpoint, mid-copy to checkpoint_last
    for phase, at in faults:
        marker.unlink(missing_ok=True)
        proc = start(tiny_data_bin, save_dir, (phase, at), marker)
        kill_when(proc, marker.exists)
        assert_checkpoints_whole(save_dir)
        assert (save_dir / "checkpoint_last.pt").exists()
    proc = start(tiny_data_bin, save_dir)  # killed in the second epoch, with checkpoint 20 whole at least
    kill_when(proc, lambda: any(save_dir.glob("checkpoint_*_22.pt*")))
    assert_checkpoints_whole(save_dir)
    # the same command again: continues from the last complete checkpoint and finishes
    proc = start(tiny_data_bin, save_dir)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    assert "Loaded checkpoint" in out
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == UPDATES
    # and it trained the network a run that was never stopped trains, bit for bit: fairseq restores the epoch's
    # batch order and position, Adam's moments and the schedule, and reseeds dropout with seed + update; the
    # batches themselves are the uninterrupted run's only with fairseq_capsagg.patches.resumable_batches (fairseq
    # draws them again in the epoch it resumes in). A long row's numbers do not depend on when its sessions ended
    proc = start(tiny_data_bin, tmp_path / "never-stopped")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    never = torch.load(tmp_path / "never-stopped" / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert never["model"].keys() == state["model"].keys()
    assert all(torch.equal(never["model"][name], state["model"][name]) for name in never["model"])
    moments = [(a[key], b[key]) for a, b in zip(never["last_optimizer_state"]["state"].values(),
                                                state["last_optimizer_state"]["state"].values())
               for key in ("exp_avg", "exp_avg_sq")]
    assert moments and all(torch.equal(a, b) for a, b in moments)


def test_atomic_copy_never_exposes_a_partial_file(tmp_path, monkeypatch):
    src = tmp_path / "checkpoint_2_4.pt"
    src.write_bytes(os.urandom(1 << 20))
    dst = tmp_path / "checkpoint_last.pt"
    dst.write_bytes(b"old, complete")

    def interrupted_copy(a, b):
        with open(a, "rb") as fa, open(b, "wb") as fb:
            fb.write(fa.read(1000))
        raise KeyboardInterrupt  # the process dies half-way through the copy

    monkeypatch.setattr("shutil.copyfile", interrupted_copy)
    with pytest.raises(KeyboardInterrupt):
        atomic_copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old, complete"
    monkeypatch.undo()
    assert atomic_copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == src.read_bytes()


def test_fp16_training_through_fairseq_on_cpu(tiny_data_bin, tmp_path):
    """fairseq-train --fp16 (FP16Optimizer, dynamic loss scaling) trains EM routing end to end."""
    result = subprocess.run(
        [str(BIN / "fairseq-train"), str(tiny_data_bin), *ARGS, "--max-update", "3", "--fp16",
         "--fp16-no-flatten-grads", "--fp16-init-scale", "8", "--save-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"(?<!\w)loss=([^,\s]+)", result.stdout + result.stderr)]
    scales = re.findall(r"(?<!\w)loss_scale=([\d.]+)", result.stdout + result.stderr)
    assert len(losses) >= 3 and all(math.isfinite(x) for x in losses)
    assert scales and float(scales[0]) == 8
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=True)
    assert state["cfg"]["common"]["fp16"] and state["optimizer_history"][-1]["num_updates"] == 3
    assert all(torch.isfinite(v).all() for v in state["model"].values())  # fairseq stores fp16 weights as fp32


def test_fairseq_loss_scaler_recovers_from_an_overflow_in_routing():
    """An fp16 gradient overflow through EM routing is caught by fairseq's scaler, which lowers the
    scale until a step succeeds (what fairseq's trainer does on a GPU; its CPU path cannot run it)."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    from helpers import build_tiny_model, parse_model_args, random_tokens

    flags = ["--fp16", "--fp16-no-flatten-grads", "--fp16-init-scale", str(2 ** 24), "--fp16-scale-window", "100",
             "--optimizer", "adam", "--lr", "1e-3", "--cpu"]
    cfg = convert_namespace_to_omegaconf(parse_model_args("transformer_emrouting_small", flags))
    model, dictionary = build_tiny_model("transformer_emrouting_small", flags)
    model = model.half().train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = FP16Optimizer.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    lengths = [9, 7, 5, 3] * 8
    src, tgt = random_tokens(dictionary, lengths, 1), random_tokens(dictionary, lengths, 2, bos=True)
    overflows = 0
    for _ in range(40):
        logits, _ = model(src, torch.tensor(lengths), tgt)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), src.flatten(),
                                                 ignore_index=dictionary.pad(), reduction="sum")
        optimizer.backward(loss)
        try:
            optimizer.clip_grad_norm(0.0)
        except OverflowError:
            overflows += 1
            optimizer.zero_grad()
            continue
        optimizer.step()
        break
    assert overflows >= 1, "the test needs an overflow to start with"
    assert optimizer.scaler.loss_scale == 2 ** 24 / 2 ** overflows  # halved once per overflow
    after = dict(model.named_parameters())
    assert all(torch.isfinite(p).all() for p in after.values())
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert any("aggregator" in n for n in changed) and any("layers" in n for n in changed)
