"""What trained a row: the code's commit and the device, as recorded with each training and listed under a table."""

import os
import subprocess

import torch

from fairseq_capsagg.pipeline import provenance


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_cpu_table_names_the_cpu_and_the_kernels_it_ran(monkeypatch):
    """Trainings of one row on two CPUs part (their kernels sum in another order): a caption says which CPU,
    which kernels PyTorch dispatched to and how many cores; a GPU caption names the GPU where there is one."""
    name = provenance.device_name(gpu=False)
    assert name.startswith("CPU (") and name.endswith(f", {os.cpu_count()} cores)")
    assert f", {torch.backends.cpu.get_cpu_capability()} kernels," in name
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert provenance.device_name(gpu=True) == "GPU"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    assert provenance.device_name(gpu=True) == "GPU (NVIDIA H200)"


def test_the_code_is_the_checkouts_commit_or_the_frozen_copys_and_never_a_guess(tmp_path, monkeypatch):
    """A checkout: its HEAD, marked when tracked files are modified. A frozen copy (a git archive unpacked under
    runs/ of a checkout): the commit its launcher names (CAPSAGG_CODE_COMMIT), never the surrounding checkout's HEAD."""
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "setup.py").write_text("x = 1\n")
    git(repo, "add", "setup.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert provenance.code_commit(repo) == head
    (repo / "untracked.txt").write_text("not code\n")
    assert provenance.code_commit(repo) == head
    (repo / "setup.py").write_text("x = 2\n")
    assert provenance.code_commit(repo) == f"{head}+modified"
    frozen = repo / "runs" / "frozen-code-abc1234"
    frozen.mkdir(parents=True)
    assert provenance.code_commit(frozen) == "unknown"
    assert provenance.code_commit(tmp_path / "elsewhere") == "unknown"
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "abc1234")
    assert provenance.code_commit(frozen) == "abc1234"
    assert provenance.provenance(gpu=False) == {"code": "abc1234", "device": provenance.device_name(gpu=False)}


def test_a_table_lists_what_trained_its_rows_by_code_and_device():
    cpu_a, cpu_b = "CPU (Intel Xeon, AVX512 kernels, 2 cores)", "CPU (AMD EPYC, AVX512 kernels, 2 cores)"
    results = {"converged-baseline-s1": {"code": "abc1234", "device": cpu_a}, "continued-baseline": {"bleu": 28.9},
               "continued-linagg": {"code": "abc1234", "device": cpu_b},
               "continued-dyncomb": {"code": "abc1234", "device": cpu_b}}
    assert provenance.format_provenance(results) == [
        f"Trained with code `abc1234` on {cpu_a}: `converged-baseline-s1`.",
        f"Trained with code `abc1234` on {cpu_b}: `continued-linagg`, `continued-dyncomb`."]
    assert provenance.format_provenance({"continued-baseline": {"bleu": 28.9}}) == []
