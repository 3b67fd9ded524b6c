"""The plugin's patches leave every stock fairseq flag doing what it does without the plugin,
and the package's layers stay apart (aggregators without fairseq, nothing run from examples/)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_capsagg import USER_DIR
from helpers import BIN, TINY_CORPUS, VANILLA_TINY, run_tool, tool_threads


PACKAGE = Path(USER_DIR)


@pytest.fixture(scope="module")
def vanilla_checkpoint(tiny_data_bin, tmp_path_factory):
    """fairseq's own ``transformer`` at the tiny shape, 3 updates, trained without the plugin."""
    save_dir = tmp_path_factory.mktemp("vanilla-for-patches")
    run_tool("fairseq-train", str(tiny_data_bin), "--arch", "transformer", *VANILLA_TINY, "--task", "translation",
             "--cpu", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000", "--max-update", "3",
             "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--num-workers", "0", "--seed", "1")
    return save_dir / "checkpoint_last.pt"


#: fairseq-interactive as fairseq ships it, but able to read checkpoints under torch >= 2.6: the
#: package is imported before fairseq_cli.interactive runs, so the guard is not installed and
#: only the checkpoint allow-list (which changes no flag) is in place.
STOCK_INTERACTIVE = ("import sys, fairseq_capsagg; from fairseq_cli.interactive import cli_main; "
                     "sys.argv[0] = 'fairseq-interactive'; cli_main()")


def interactive(data, checkpoint, lines, *flags, plugin: bool, check: bool = True):
    """``(sorted S-/H-/D- lines, stdout + stderr)`` of fairseq-interactive with or without the plugin."""
    args = [str(data), "--path", str(checkpoint), "--source-lang", "en", "--target-lang", "de", "--beam", "1",
            "--max-len-b", "5", "--cpu", *flags]
    command = ([str(BIN / "fairseq-interactive"), *args, "--user-dir", USER_DIR] if plugin
               else [sys.executable, "-c", STOCK_INTERACTIVE, *args])
    result = subprocess.run(command, input="".join(line + "\n" for line in lines), capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, OMP_NUM_THREADS=tool_threads(), PYTHONWARNINGS="ignore"))
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    outputs = sorted(line for line in result.stdout.splitlines() if re.match(r"^[SHD]-\d+\t", line))
    return outputs, result.stdout + result.stderr


@pytest.fixture(scope="module")
def whitespace_sentencepiece(tmp_path_factory):
    """A sentencepiece model that keeps every space (``remove_extra_whitespaces=False``)."""
    import sentencepiece as spm

    prefix = tmp_path_factory.mktemp("spm-spaces") / "spm"
    spm.SentencePieceTrainer.train(input=str(TINY_CORPUS / "train.en"), model_prefix=str(prefix), vocab_size=200,
                                   remove_extra_whitespaces=False, minloglevel=2)
    return prefix.with_suffix(".model")


def test_whitespace_reaches_a_whitespace_sensitive_bpe_as_without_the_plugin(
        tiny_data_bin, vanilla_checkpoint, whitespace_sentencepiece):
    """A ``--bpe`` that reads every space gets the line as fairseq reads it: only its ends stripped."""
    lines = ["the  file   is open .", "the file is open .", "  two\tfields  "]
    flags = ("--bpe", "sentencepiece", "--sentencepiece-model", str(whitespace_sentencepiece))
    stock, _ = interactive(tiny_data_bin, vanilla_checkpoint, lines, *flags, plugin=False)
    patched, _ = interactive(tiny_data_bin, vanilla_checkpoint, lines, *flags, plugin=True)
    assert patched == stock
    sources = {line.split("\t")[0]: line.split("\t")[-1].split() for line in stock if line.startswith("S-")}
    assert len(sources["S-0"]) > len(sources["S-1"])  # the extra spaces are pieces of their own


def test_skip_invalid_size_inputs_still_skips_long_lines(tiny_data_bin, vanilla_checkpoint):
    """With ``--skip-invalid-size-inputs-valid-test`` fairseq skips a too-long line; the guard
    keeps that (it truncates only when fairseq would stop the run) and says so."""
    lines = ["Open the file .", "word " * 1100, "Save the document ."]
    flags = ("--skip-invalid-size-inputs-valid-test",)
    stock, _ = interactive(tiny_data_bin, vanilla_checkpoint, lines, *flags, plugin=False)
    patched, log = interactive(tiny_data_bin, vanilla_checkpoint, lines, *flags, plugin=True)
    assert patched == stock
    assert not any(line.startswith(("H-1\t", "S-1\t")) for line in patched)
    assert re.search(r"input line 2 \(H-1\): 1100 subword tokens, longer than 1023; skipped", log)


def test_without_the_skip_flag_a_long_line_is_truncated_not_fatal(tiny_data_bin, vanilla_checkpoint):
    lines = ["Open the file .", "word " * 1100]
    _, stock = interactive(tiny_data_bin, vanilla_checkpoint, lines, plugin=False, check=False)
    assert "exceeds the size limit" in stock or "max_positions" in stock  # fairseq itself stops at the line
    patched, log = interactive(tiny_data_bin, vanilla_checkpoint, lines, plugin=True)
    assert any(line.startswith("H-1\t") for line in patched)
    assert "input line 2 (H-1): 1100 subword tokens, truncated to 1023" in log


def test_aggregators_need_no_fairseq():
    """With fairseq made unimportable, the aggregators build and run, and no patch is installed."""
    code = (
        "import sys; sys.modules['fairseq'] = None\n"
        "import torch\n"
        "from fairseq_capsagg.aggregators import build_aggregator, aggregation_choices\n"
        "agg = build_aggregator('em-routing', 16, 3, {'output_capsules': 4})\n"
        "out = agg([torch.randn(5, 2, 16) for _ in range(3)])\n"
        "assert out.shape == (5, 2, 16)\n"
        "assert sys.excepthook is sys.__excepthook__\n"
        "assert not any(m.startswith('fairseq_capsagg.' + p) for m in sys.modules for p in ('models', 'patches'))\n"
        "print(','.join(aggregation_choices()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "none,linear,dynamic,dynamic-routing,em-routing,dwa,depth-attention,mudd,dlcl"


def test_importing_the_plugin_keeps_fairseqs_debug_logging_off():
    """fairseq's import sets the root logger to DEBUG; the package configures logging first."""
    code = (
        "import logging\n"
        "import fairseq_capsagg.analysis.plotting\n"
        "print(logging.getLevelName(logging.getLogger().level))\n"
    )
    for env, level in (({}, "INFO"), ({"LOGLEVEL": "warning"}, "WARNING")):
        environ = {k: v for k, v in os.environ.items() if k != "LOGLEVEL"} | env
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=environ)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == level
        assert "DEBUG" not in result.stderr  # matplotlib's import logs at DEBUG


def imported_modules(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_aggregators_import_only_torch_and_the_standard_library():
    for path in sorted((PACKAGE / "aggregators").glob("*.py")):
        for module in imported_modules(path):
            assert not module.startswith(("fairseq", "fairseq_capsagg")), f"{path.name} imports {module}"


def test_nothing_in_the_package_runs_examples_by_path():
    """The sweep and the tools work from an installed wheel, which carries no examples/."""
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.read_text()
        assert not re.search(r"""["'/]examples["'/]""", source), f"{path.relative_to(PACKAGE)} refers to examples/"


def test_fairseq_tools_run_as_modules_where_their_scripts_are_not_beside_python(tmp_path, monkeypatch):
    """On a machine where fairseq was installed with pip --target (the lent GPU's), its console scripts are
    not beside the Python that runs the drivers: the drivers then run fairseq_cli's modules."""
    from fairseq_capsagg.pipeline import fairseq_runs

    assert fairseq_runs.tool_command("fairseq-train") == [str(BIN / "fairseq-train")]
    monkeypatch.setattr(fairseq_runs, "BIN", tmp_path / "no-scripts")
    assert fairseq_runs.tool_command("fairseq-train") == [sys.executable, "-m", "fairseq_cli.train"]
    data = tmp_path / "data-bin"
    fairseq_runs.run_logged("fairseq-preprocess", [
        "--source-lang", "en", "--target-lang", "de", "--trainpref", str(TINY_CORPUS / "train"),
        "--validpref", str(TINY_CORPUS / "valid"), "--joined-dictionary", "--destdir", str(data)],
        tmp_path / "preprocess.log")
    assert (data / "dict.en.txt").stat().st_size > 0 and (data / "valid.en-de.de.bin").exists()
