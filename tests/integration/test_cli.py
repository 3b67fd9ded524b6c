"""Round trips through the real fairseq console scripts with --user-dir."""

import re

import pytest

from helpers import FAMILIES, TINY_CORPUS, run_tool, train
from fairseq_capsagg import USER_DIR


@pytest.mark.parametrize("family", FAMILIES)
def test_preprocess_train_generate_interactive(family, tiny_data_bin, tmp_path):
    arch = f"transformer_{family}_small"
    result = train(tiny_data_bin, tmp_path, arch)
    assert "num. updates: 3" in result.stderr + result.stdout or (tmp_path / "checkpoint_last.pt").exists()
    checkpoint = tmp_path / "checkpoint_last.pt"
    assert checkpoint.exists()
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+)", result.stderr + result.stdout)]
    assert losses and all(loss == loss for loss in losses)  # logged and not NaN

    generated = run_tool(
        "fairseq-generate", str(tiny_data_bin), "--user-dir", USER_DIR, "--path", str(checkpoint),
        "--gen-subset", "test", "--beam", "2", "--max-len-b", "8", "--batch-size", "16", "--cpu",
        "--source-lang", "en", "--target-lang", "de",
    )
    hypotheses = [line for line in generated.stdout.splitlines() if line.startswith("H-")]
    assert len(hypotheses) == len((TINY_CORPUS / "test.en").read_text().splitlines())

    source = "Are you taking any other medications ?\nThe book is on the table .\n"
    interactive = run_tool(
        "fairseq-interactive", str(tiny_data_bin), "--user-dir", USER_DIR, "--path", str(checkpoint),
        "--beam", "2", "--max-len-b", "8", "--cpu", "--source-lang", "en", "--target-lang", "de",
        stdin=source,
    )
    assert len([line for line in interactive.stdout.splitlines() if line.startswith("H-")]) == 2


def test_bad_capsule_count_is_one_clear_line(tiny_data_bin, tmp_path):
    result = run_tool(
        "fairseq-train", str(tiny_data_bin), "--user-dir", USER_DIR, "--arch",
        "transformer_emrouting_small", "--output-capsules", "48", "--cpu", "--max-update", "1",
        "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000", "--save-dir", str(tmp_path),
        check=False,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert error_lines == [
        "fairseq-train: error: --output-capsules: got 48, but it must be a positive divisor of "
        "the model dimension 128 (allowed: 1, 2, 4, 8, 16, 32, 64, 128)"
    ]
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_unknown_aggregation_is_refused_by_the_parser(tiny_data_bin, tmp_path):
    result = run_tool(
        "fairseq-train", str(tiny_data_bin), "--user-dir", USER_DIR, "--arch",
        "transformer_linagg_small", "--encoder-aggregation", "mean", "--cpu",
        "--save-dir", str(tmp_path), check=False,
    )
    assert result.returncode == 2
    assert "argument --encoder-aggregation: invalid choice: 'mean'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("arch,flags,message", [
    ("emrouting", ["--routing-init", "zeros"],
     "argument --routing-init: invalid choice: 'zeros' (choose from 'random', 'identity')"),
    ("emrouting", ["--aggregation-ramp-updates", "-1"],
     "fairseq-train: error: --aggregation-ramp-updates: got -1; it must be an integer >= 0 (0: no ramp)"),
    ("mudd", ["--encoder-dense-connections", "em-routing"],
     "argument --encoder-dense-connections: invalid choice: 'em-routing' "
     "(choose from 'none', 'dwa', 'depth-attention', 'mudd', 'dlcl', 'hyper-connections', 'mhc')"),
    ("mudd", ["--depth-attention-query", "learned"],
     "argument --depth-attention-query: invalid choice: 'learned' (choose from 'static', 'dynamic')"),
    ("mudd", ["--mudd-hidden-dim", "0"],
     "fairseq-train: error: --mudd-hidden-dim: got 0; it must be a positive integer"),
])
def test_bad_routing_or_dense_flag_is_one_clear_line(arch, flags, message, tiny_data_bin, tmp_path):
    result = run_tool(
        "fairseq-train", str(tiny_data_bin), "--user-dir", USER_DIR, "--arch", f"transformer_{arch}_small",
        *flags, "--cpu", "--max-update", "1", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000",
        "--save-dir", str(tmp_path), check=False,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert len([line for line in result.stderr.splitlines() if "error" in line]) == 1
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_tensorboard_logdir_writes_event_files(tiny_data_bin, tmp_path):
    """tensorboardX is installed, so fairseq's --tensorboard-logdir (how NMT users watch training) works."""
    train(tiny_data_bin, tmp_path / "checkpoints", "transformer_emrouting_small", "--tensorboard-logdir",
          str(tmp_path / "tensorboard"))
    events = sorted(p.relative_to(tmp_path / "tensorboard").parts[0]
                    for p in (tmp_path / "tensorboard").rglob("events.out.tfevents.*"))
    assert "train" in events and "valid" in events
