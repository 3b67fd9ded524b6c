"""The plugin installed into a user's environment that already has torch and fairseq, as the README's "Into your own
environment" says: pip resolves it against what is there (no index: nothing downloaded, torch never replaced), its
tools start without the experiments' extra (its drivers say how to add it), and ``fairseq-train --user-dir`` trains
with it from any directory."""

import os
import shutil
import subprocess
import sys
import sysconfig

from helpers import ROOT, TINY, tool_threads

#: What the user's environment must not see of this checkout's own install (editable, in .venv), and the packages
#: of the experiments' extra that fairseq does not itself require (its scikit-learn brings scipy, sacrebleu is its).
OWN = ("fairseq_capsagg", "__editable__", "_fairseq_capsagg", "fairseq-capsagg")
EXTRA = ("matplotlib", "mpl_toolkits", "pylab", "sentencepiece", "subword_nmt")


def users_environment(path):
    """A virtual environment without pip whose packages are this one's (torch, fairseq, pip, ...) but the plugin and
    the experiments' extra: a directory of links to them, put on its path by a .pth file."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    existing = path / "existing"
    existing.mkdir()
    for entry in os.scandir(sysconfig.get_paths()["purelib"]):
        if not entry.name.startswith(OWN + EXTRA) and not entry.name.endswith(".pth"):
            (existing / entry.name).symlink_to(entry.path)
    site = next(path.glob("lib/python*/site-packages"))
    (site / "existing.pth").write_text(f"{existing}\n")
    return path / "bin" / "python"


def run(*args, cwd=None):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=600,
                            env=dict(os.environ, OMP_NUM_THREADS=tool_threads(), PYTHONPATH=""))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_the_plugin_installs_beside_torch_and_fairseq_and_trains_from_any_directory(tmp_path, tiny_data_bin):
    source, wheels = tmp_path / "source", tmp_path / "wheels"  # a copy: building writes into the source tree
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "runs", "build", "*.egg-info", "__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source)
    python = users_environment(tmp_path / "env")
    assert "torch" in run(python, "-c", "import torch, fairseq; print('torch', torch.__version__)")
    run(python, "-m", "pip", "install", "-q", "--no-index", *wheels.glob("*.whl"))  # dependencies: what is there
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    user_dir = run(python, "-c", "import fairseq_capsagg; print(fairseq_capsagg.USER_DIR)", cwd=elsewhere).strip()
    assert user_dir.startswith(str(tmp_path / "env")), user_dir  # the installed copy, not this checkout
    for tool in ("capsagg-params", "capsagg-translate", "capsagg-health"):  # the plugin's own, without the extra
        assert "usage:" in run(tmp_path / "env" / "bin" / tool, "--help", cwd=elsewhere), tool
    for driver in ("capsagg-table1", "capsagg-main-job"):  # the experiments' say what they lack, and how to add it
        refused = subprocess.run([tmp_path / "env" / "bin" / driver, "--help"], capture_output=True, text=True,
                                 cwd=elsewhere, env=dict(os.environ, PYTHONPATH=""))
        assert refused.returncode != 0 and ("needs the 'experiments' extra, which is not installed (missing: "
                                            "sentencepiece, subword-nmt, matplotlib); in the clone: pip install "
                                            "'.[experiments]'") in refused.stderr, refused.stderr[-2000:]
    run(python, "-m", "fairseq_cli.train", tiny_data_bin, "--user-dir", user_dir,
              "--arch", "transformer_dyncomb_base", *TINY, "--task", "translation", "--source-lang", "en",
              "--target-lang", "de", "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000",
              "--max-update", "3", "--criterion", "label_smoothed_cross_entropy", "--save-dir", tmp_path / "ckpt",
              "--no-epoch-checkpoints", "--log-format", "simple", "--num-workers", "0", cwd=elsewhere)
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").exists()
