"""What produced a row: the code's commit and the device, recorded with every training so that a table can
say which machine and which code trained each row (rows of one table may train on several machines, and
trainings of one row on two CPUs need not agree)."""

import os
import platform
import subprocess
from pathlib import Path
from typing import Dict, List, Mapping

import torch

#: The commit of a frozen copy of the code (``git archive`` unpacked elsewhere, so that a long run keeps its code
#: while the checkout changes), which has no git history of its own: its launcher sets it.
COMMIT_VARIABLE = "CAPSAGG_CODE_COMMIT"
#: The checkout this package was imported from, if it is one.
CHECKOUT = Path(__file__).resolve().parents[2]


def device_name(gpu: bool) -> str:
    """The device a table was measured on, for its caption: ``GPU (NVIDIA H200)``, ``CPU (AMD EPYC, AVX512
    kernels, 2 cores)``. PyTorch's CPU kernels, and with them the last digits of every sum, depend on the vector
    width they dispatch to: trainings of one row on two machines need not agree."""
    if gpu:
        return f"GPU ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "GPU"
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 platform.processor() or platform.machine())
    return f"CPU ({model}, {torch.backends.cpu.get_cpu_capability()} kernels, {os.cpu_count()} cores)"


def code_commit(checkout: Path = CHECKOUT) -> str:
    """The short commit of the code: :data:`COMMIT_VARIABLE` where set (a frozen copy), else ``checkout``'s
    HEAD when ``checkout`` is the top of a git work tree (``+modified`` with uncommitted changes to tracked
    files), else ``unknown`` (an installed package, or a copy inside another repository's tree)."""
    if os.environ.get(COMMIT_VARIABLE):
        return os.environ[COMMIT_VARIABLE]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != checkout.resolve():
            return "unknown"
        modified = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "--short", "HEAD") + ("+modified" if modified else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def provenance(gpu: bool) -> Dict[str, str]:
    """``{"code": code_commit(), "device": device_name(gpu)}``: recorded with a row's training when it ends, so
    the code of its last segment."""
    return {"code": code_commit(), "device": device_name(gpu)}


def format_provenance(results: Mapping[str, Mapping[str, object]]) -> List[str]:
    """One line per code and device that trained rows of a table, naming the rows (those recorded since
    :func:`provenance` was; none for older ones)."""
    trained: Dict[tuple, List[str]] = {}
    for name, res in results.items():
        if "code" in res:
            trained.setdefault((res["code"], res["device"]), []).append(f"`{name}`")
    return [f"Trained with code `{code}` on {device}: {', '.join(names)}." for (code, device), names in trained.items()]
