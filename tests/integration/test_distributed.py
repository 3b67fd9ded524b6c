"""Multi-process training: fairseq's distributed path and torch DDP with no unused parameters."""

import json
import os
import socket
import subprocess
import sys

import torch.multiprocessing as mp

import ddp_worker
from fairseq_capsagg import USER_DIR
from helpers import SUPPORT, TINY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_hand_launched_fairseq_ranks_stay_identical(tiny_data_bin, tmp_path):
    port = free_port()
    common = [str(tiny_data_bin), "--user-dir", USER_DIR, "--arch", "transformer_emrouting_small", *TINY,
              "--task", "translation", "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "600",
              "--max-update", "4", "--save-dir", str(tmp_path / "ckpt"), "--no-epoch-checkpoints",
              "--num-workers", "0", "--seed", "3", "--distributed-world-size", "2", "--distributed-no-spawn",
              "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-backend", "gloo",
              "--ddp-backend", "legacy_ddp"]
    env = dict(os.environ, PYTHONPATH=str(SUPPORT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = [subprocess.Popen([sys.executable, str(SUPPORT / "ddp_rank.py"), str(tmp_path / f"rank{r}.json"),
                               *common, "--distributed-rank", str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]
    assert "distributed init (rank 1)" in outputs[0] + outputs[1]
    hashes = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert len(hashes[0]) == 4 and len(set(hashes[0])) == 4  # four updates, each changed the weights
    assert hashes[0] == hashes[1]
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()


def test_torch_ddp_without_unused_parameter_search(tmp_path):
    out = tmp_path / "ddp.json"
    mp.spawn(ddp_worker.run, args=(2, free_port(), str(out)), nprocs=2, join=True)
    report = json.loads(out.read_text())
    assert set(report) == set(ddp_worker.FAMILIES)
    assert all(r["identical"] and r["changed"] for r in report.values()), report
