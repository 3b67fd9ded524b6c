"""The drivers decode inside their own process (fairseq_runs.run_generate): fairseq-generate's own output,
its log in the file named for it, the driver's logging as it was, and a failure as one ToolFailed."""

import logging
from pathlib import Path

import pytest

from fairseq_capsagg import USER_DIR
from fairseq_capsagg.pipeline import fairseq_runs
from helpers import TINY_CORPUS, run_tool

LEGACY = Path(__file__).parents[1] / "data" / "legacy"


def decoding_args(data_bin, checkpoint=LEGACY / "emrouting.pt"):
    return [str(data_bin), "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", "test",
            "--beam", "2", "--max-len-b", "8", "--batch-size", "16", "--cpu", "--source-lang", "en",
            "--target-lang", "de"]


def output_lines(text: str):
    return [line for line in text.splitlines() if line[:2] in ("S-", "T-", "H-", "D-", "P-")]


def by_id(text: str, prefix: str):
    """{sentence id: text} of the ``prefix`` lines (``T-``, ``H-``)."""
    return {line.split("\t")[0][2:]: line.split("\t")[-1] for line in text.splitlines() if line.startswith(prefix)}


def test_in_process_decoding_prints_what_the_console_script_prints(tiny_data_bin, tmp_path):
    console = run_tool("fairseq-generate", *decoding_args(tiny_data_bin)).stdout
    sentences = len((TINY_CORPUS / "test.en").read_text().splitlines())
    handlers = logging.getLogger().handlers[:]
    for name in ("first", "second"):  # a second decoding in the same process: nothing kept from the first
        fairseq_runs.run_generate(decoding_args(tiny_data_bin), tmp_path / f"{name}.log", tmp_path / f"{name}.txt")
        assert output_lines((tmp_path / f"{name}.txt").read_text()) == output_lines(console)
        assert f"Translated {sentences} sentences" in (tmp_path / f"{name}.log").read_text()
    assert logging.getLogger().handlers == handlers
    for name in ("first", "second"):  # each log holds its own decoding's lines only (one configuration each)
        assert (tmp_path / f"{name}.log").read_text().count("| INFO | fairseq_cli.generate | {'_name'") == 1
    scored = tmp_path / "scored.txt"  # --score-reference, as the converged rows use it: the references' own scores
    fairseq_runs.run_generate([*decoding_args(tiny_data_bin), "--score-reference"], tmp_path / "scored.log", scored)
    # fairseq writes a target's unknown words as <<unk>> (escape_unk), a hypothesis' as <unk>
    references = {i: text.replace("<<unk>>", "<unk>") for i, text in by_id(console, "T-").items()}
    assert len(references) == sentences and by_id(scored.read_text(), "H-") == references


def test_a_failing_decoding_is_one_tool_failed_naming_its_log(tiny_data_bin, tmp_path):
    handlers = logging.getLogger().handlers[:]
    with pytest.raises(fairseq_runs.ToolFailed, match=r"\(OSError: Model file not found: .*missing\.pt\); its log is"):
        fairseq_runs.run_generate(decoding_args(tiny_data_bin, tmp_path / "missing.pt"), tmp_path / "a.log",
                                  tmp_path / "a.txt")
    assert "Traceback" in (tmp_path / "a.log").read_text()
    with pytest.raises(fairseq_runs.ToolFailed, match=r"refused its arguments \(exit code 2\); its log is"):
        fairseq_runs.run_generate([*decoding_args(tiny_data_bin), "--beam", "two"], tmp_path / "b.log",
                                  tmp_path / "b.txt")
    assert "fairseq-generate: error: argument --beam: invalid int value: 'two'" in (tmp_path / "b.log").read_text()
    assert logging.getLogger().handlers == handlers
