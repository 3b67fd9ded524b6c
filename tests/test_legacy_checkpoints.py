"""Checkpoints saved by an earlier version of the plugin load and compute what they did.

``tests/data/legacy/`` holds two tiny checkpoints written by commit f10dcaa (before the
aggregator registry): EM routing on both sides with ``--routing-init identity`` and a ramp
stopped half-way, and dynamic combination on the encoder only, each with the logits it gave
on fixed tokens and its ``fairseq-generate`` output on the tiny test split.
"""

from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils

from helpers import run_tool
from fairseq_capsagg import USER_DIR

pytestmark = pytest.mark.slow  # trains, runs console scripts or launches processes

LEGACY = Path(__file__).parent / "data" / "legacy"
NAMES = ("emrouting", "dyncomb")


@pytest.mark.parametrize("name", NAMES)
def test_legacy_checkpoint_gives_the_same_logits(name, tiny_data_bin):
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(LEGACY / f"{name}.pt")], arg_overrides={"data": str(tiny_data_bin), "user_dir": USER_DIR})
    expected = torch.load(LEGACY / f"{name}.expected.pt")
    model = models[0].eval()
    with torch.no_grad():
        logits, _ = model(expected["src_tokens"], expected["src_lengths"], expected["prev_output_tokens"])
    torch.testing.assert_close(logits[..., :40], expected["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_legacy_checkpoint_generates_the_same_translations(name, tiny_data_bin):
    generated = run_tool(
        "fairseq-generate", str(tiny_data_bin), "--user-dir", USER_DIR, "--path", str(LEGACY / f"{name}.pt"),
        "--gen-subset", "test", "--beam", "2", "--max-len-b", "8", "--batch-size", "16", "--cpu",
        "--source-lang", "en", "--target-lang", "de")
    hypotheses = sorted(line for line in generated.stdout.splitlines() if line.startswith("H-"))
    assert hypotheses == (LEGACY / f"{name}.generate.txt").read_text().splitlines()
