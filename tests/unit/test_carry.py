"""A converged work directory carried to the next machine (pipeline.carry): what a resumed run needs, and
nothing it rebuilds (no training: fairseq's checkpoints are simulated by their fields)."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from fairseq_capsagg.pipeline import carry, convergence

CONFIG = {"validate_interval_updates": 500, "patience_updates": 3000, "update_cap": 30000, "warm_updates": 3000}


def checkpoint(path: Path, update: int, loss: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": {"w": torch.full((2,), float(update))}, "optimizer_history": [{"num_updates": update}],
                "extra_state": {"val_loss": loss}, "last_optimizer_state": {"state": {0: torch.ones(2)}}}, path)


def work_directory(tmp_path: Path) -> Path:
    """A run whose Transformer is trained and averaged and whose continued row trains at update 2,000 with its
    best checkpoint at 1,500; its corpus, encoded training split and the live queue's files beside them."""
    work = tmp_path / "work"
    stages = {"corpus": {}, "subwords": {}, "binarise": {}, "train converged-baseline-s1": {},
              "average converged-baseline-s1": {}}
    for relative, text in {"stages.json": json.dumps(stages), "config.json": json.dumps(CONFIG),
                           "queue.commit": "617b903\n", "queue.pid": "1\n", "stages.lock": "",
                           "corpus/train.en": "a\n", "corpus/test.de": "b\n", "spm/train.de": "c\n",
                           "spm/spm.model": "m", "data-bin/dict.de.txt": "d 1\n",
                           "logs/train-continued-baseline/from-0.log": "log\n"}.items():
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        (work / relative).write_text(text)
    reference = work / "checkpoints" / "converged-baseline-s1"
    for update in (24000, 24500, 25000):
        checkpoint(reference / f"checkpoint_40_{update}.pt", update, 4.7)
    checkpoint(reference / "checkpoint_best.pt", 22000, 4.6)
    checkpoint(reference / "checkpoint_last.pt", 25000, 4.7)
    checkpoint(reference / "checkpoint_average.pt", 25000, 4.7)
    continued = work / "checkpoints" / "continued-baseline"
    for update in (500, 1000, 1500, 2000):
        checkpoint(continued / f"checkpoint_1_{update}.pt", update, 5.0 - update / 1e4)
    checkpoint(continued / "checkpoint_best.pt", 1500, 4.5)
    checkpoint(continued / "checkpoint_last.pt", 2000, 4.6)
    return work


def test_a_restored_run_has_what_it_resumes_from_and_nothing_it_rebuilds(tmp_path):
    work = work_directory(tmp_path)
    archive = carry.save(work, tmp_path / "checkout" / "carry" / "converged.tar.xz")
    restored = tmp_path / "next-machine"
    carry.restore(archive, restored)
    files = {p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()}
    assert files == {
        "stages.json", "config.json", "queue.commit", "spm/spm.model", "data-bin/dict.de.txt",
        "logs/train-continued-baseline/from-0.log", carry.MANIFEST,
        "checkpoints/converged-baseline-s1/checkpoint_best.pt",
        "checkpoints/converged-baseline-s1/checkpoint_average.pt",
        # the continued row stops at 3,000 whatever its best: its last five intervals are from 1,000 on
        "checkpoints/continued-baseline/checkpoint_last.pt", "checkpoints/continued-baseline/checkpoint_best.pt",
        "checkpoints/continued-baseline/checkpoint_1_1000.pt", "checkpoints/continued-baseline/checkpoint_1_1500.pt",
        "checkpoints/continued-baseline/checkpoint_1_2000.pt"}
    assert "corpus" not in json.loads((restored / "stages.json").read_text())  # rebuilt from ../shared
    last = torch.load(restored / "checkpoints/continued-baseline/checkpoint_last.pt", weights_only=True)
    assert torch.equal(last["last_optimizer_state"]["state"][0], torch.ones(2))  # resumes exactly
    for path in (restored / "checkpoints").rglob("checkpoint_*.pt"):
        if path.name != "checkpoint_last.pt":
            state = torch.load(path, weights_only=True)
            assert state["last_optimizer_state"] is None, path
            assert state["model"]["w"][0] == convergence.checkpoint_updates(path)[0]
    assert convergence.on_disk(restored / "checkpoints" / "continued-baseline") == {
        "stopped_at": 2000, "best_update": 1500, "best_loss": 4.5}


def test_only_the_intervals_that_can_still_be_averaged_are_carried():
    intervals = list(range(500, 10001, 500))
    # from scratch, best at 8,000: it stops at 11,000 at the earliest, averaging 9,000 to 11,000
    assert carry.still_averaged(intervals, 8000, CONFIG, continued=False) == [9000, 9500, 10000]
    # best at 6,500 of 7,000: none of the kept five (5,000 to 7,000) can be among the last five
    assert carry.still_averaged(list(range(5000, 7001, 500)), 6500, CONFIG, continued=False) == []
    # near the cap the cap decides
    assert carry.still_averaged([27500, 28000, 28500], 28500, CONFIG, continued=False) == [28000, 28500]
    assert carry.still_averaged([500, 1000], 500, CONFIG, continued=True) == [1000]


def test_a_row_whose_best_is_its_last_carries_one_copy(tmp_path):
    work = work_directory(tmp_path)
    continued = work / "checkpoints" / "continued-baseline"
    checkpoint(continued / "checkpoint_best.pt", 2000, 4.4)
    archive = carry.save(work, tmp_path / "converged.tar.xz")
    with tarfile.open(archive) as tar:
        assert "./checkpoints/continued-baseline/checkpoint_best.pt" not in tar.getnames()
    restored = tmp_path / "restored"
    assert carry.restore(archive, restored)["best_is_last"] == {"continued-baseline": "checkpoint_best.pt"}
    assert convergence.on_disk(restored / "checkpoints" / "continued-baseline")["best_update"] == 2000


def test_a_restore_never_overwrites_a_run_and_bad_calls_are_one_line(tmp_path):
    work = work_directory(tmp_path)
    archive = carry.save(work, tmp_path / "converged.tar.xz")
    with pytest.raises(carry.CarryError, match="holds a run already"):
        carry.restore(archive, work)
    result = subprocess.run([sys.executable, "-m", "fairseq_capsagg.pipeline.carry", "save", str(tmp_path / "none"),
                             str(tmp_path / "x.tar.xz")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "carry: error: " in result.stderr and "nothing to carry" in result.stderr
