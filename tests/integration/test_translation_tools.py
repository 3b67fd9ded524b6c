"""The translation entry points on a tiny sentencepiece model, without the main job.

The hub (``fairseq_capsagg.tools.hub``), ``capsagg-translate`` and ``fairseq-interactive``
with the plugin's guard each translate every line, good or bad, and say what they repaired.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_capsagg.pipeline.subwords import encode_corpus, learn, subword_model
from helpers import ROOT, TINY_CORPUS, run_tool, train


@pytest.fixture(scope="module")
def tiny_sentencepiece_model(tmp_path_factory):
    """A tiny corpus in sentencepiece subwords, binarised, and EM routing trained for 3 updates on it;
    laid out as the main job lays out its work directory."""
    work = tmp_path_factory.mktemp("tiny-spm")
    model = subword_model("sentencepiece", work)
    learn(model, TINY_CORPUS, ("en", "de"), 300)
    encode_corpus(model, TINY_CORPUS, ("en", "de"), work / "subwords", max_train_tokens=256)
    run_tool("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
             "--trainpref", str(work / "subwords" / "train"),
             "--validpref", str(work / "subwords" / "valid"), "--testpref", str(work / "subwords" / "test"),
             "--joined-dictionary", "--destdir", str(work / "data-bin"), "--workers", "1")
    train(work / "data-bin", work / "checkpoints" / "emrouting", "transformer_emrouting_small")
    return work


def test_hub_loads_and_translates_with_sentencepiece(tiny_sentencepiece_model):
    from fairseq_capsagg.tools.hub import from_pretrained
    from fairseq_capsagg.models import CapsAggTransformerModel

    workdir = tiny_sentencepiece_model
    hub = from_pretrained(workdir / "checkpoints" / "emrouting", "checkpoint_last.pt",
                          data_name_or_path=workdir / "data-bin", bpe="sentencepiece",
                          sentencepiece_model=str(workdir / "spm" / "spm.model"))
    assert isinstance(hub.models[0], CapsAggTransformerModel)
    out = hub.translate(["Open the file.", "Save the document as PDF."], beam=2)
    assert len(out) == 2 and all(isinstance(s, str) and "▁" not in s for s in out)


BAD_INPUTS = {
    "empty line": b"",
    "whitespace only": b"   \t ",
    "longer than --max-source-positions": ("word " * 1500).encode(),
    "control characters": b"Open\x01 the\x07 file.",
    "invalid UTF-8": b"\xff\xfe Save the file.",
    "unseen scripts": "日本語のテキスト 🚀 Ελληνικά".encode(),
}
#: every bad input between two good lines, as each entry point gets it
LINES = [b"Open the file."] + list(BAD_INPUTS.values()) + [b"Save the document."]


def test_translate_survives_every_bad_input(tiny_sentencepiece_model):
    workdir = tiny_sentencepiece_model
    result = subprocess.run(
        [str(Path(sys.executable).parent / "capsagg-translate"), "--model-dir",
         str(workdir / "checkpoints" / "emrouting"), "--checkpoint", "checkpoint_last.pt", "--data",
         str(workdir / "data-bin"), "--sentencepiece-model", str(workdir / "spm" / "spm.model"), "--beam", "1"],
        input=b"\n".join(LINES) + b"\n", capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()[-3000:]
    out = result.stdout.decode().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(LINES)  # one output line per input line
    messages = [m for m in result.stderr.decode().splitlines() if m.startswith("capsagg-translate: line")]
    expected = [
        r"line 2: empty input, nothing to translate",
        r"line 3: empty input, nothing to translate",
        r"line 4: \d{4} subword tokens, truncated to 1023",
        r"line 5: control characters removed",
        r"line 6: invalid UTF-8 bytes replaced by U\+FFFD",
    ]
    assert len(messages) == len(expected)
    for message, pattern in zip(messages, expected):
        assert re.fullmatch("capsagg-translate: " + pattern, message), message
    assert out[0] and out[-2]  # the first and last lines were still translated
    assert out[1] == "" and out[2] == ""


@pytest.mark.parametrize("launcher", ["console script", "python -m"])
def test_fairseq_interactive_survives_every_bad_input(tiny_sentencepiece_model, launcher):
    workdir = tiny_sentencepiece_model
    command = ([str(Path(sys.executable).parent / "fairseq-interactive")] if launcher == "console script"
               else [sys.executable, "-m", "fairseq_cli.interactive"])
    result = subprocess.run(
        [*command, str(workdir / "data-bin"), "--user-dir", str(ROOT / "fairseq_capsagg"), "--path",
         str(workdir / "checkpoints" / "emrouting" / "checkpoint_last.pt"), "--source-lang", "en",
         "--target-lang", "de", "--bpe", "sentencepiece", "--sentencepiece-model", str(workdir / "spm" / "spm.model"),
         "--beam", "1", "--cpu", "--buffer-size", "3", "--batch-size", "3"],
        input=b"\n".join(LINES) + b"\n", capture_output=True, timeout=600)
    output = result.stdout.decode() + result.stderr.decode()
    assert result.returncode == 0, output[-3000:]
    hypotheses = re.findall(r"^D-(\d+)\t", output, flags=re.M)
    assert sorted(int(i) for i in hypotheses) == list(range(len(LINES)))  # every line translated
    messages = re.findall(r"input line (\d+) \(H-(\d+)\): (.*)$", output, flags=re.M)
    assert all(int(line) == int(hid) + 1 for line, hid, _ in messages)  # fairseq's id is named
    notes = {int(line): note for line, _, note in messages}
    assert len(notes) == len(messages) == 5  # one message for each line that needs one
    assert notes[2] == notes[3] == "empty input (fairseq translates it as an empty sentence)"
    assert re.fullmatch(r"\d{4} subword tokens, truncated to 1023", notes[4])
    assert notes[5] == "control characters removed"
    assert notes[6] == "invalid UTF-8 bytes replaced by U+FFFD"


def test_hub_translate_survives_every_bad_input(tiny_sentencepiece_model, caplog):
    from fairseq_capsagg.tools.hub import from_pretrained

    workdir = tiny_sentencepiece_model
    hub = from_pretrained(workdir / "checkpoints" / "emrouting", "checkpoint_last.pt",
                          data_name_or_path=workdir / "data-bin", bpe="sentencepiece",
                          sentencepiece_model=str(workdir / "spm" / "spm.model"))
    sentences = [line.decode("utf-8", errors="surrogateescape") for line in LINES]  # str, as Python reads it
    with caplog.at_level("WARNING", logger="fairseq_capsagg.tools.hub"):
        out = hub.translate(sentences, beam=1)
        from_bytes = hub.translate(LINES, beam=1)
    assert len(out) == len(LINES) and out == from_bytes
    assert out[0] and out[-1] and out[1] == out[2] == ""
    assert all(out[i] for i in (3, 4, 5, 6))
    notes = [r.getMessage() for r in caplog.records if r.name == "fairseq_capsagg.tools.hub"]
    assert len(notes) == 10 and notes[:5] == notes[5:]
    assert notes[:2] == ["sentence 1: empty input, nothing to translate", "sentence 2: empty input, nothing to translate"]
    assert re.fullmatch(r"sentence 3: \d{4} subword tokens, truncated to 1023", notes[2])
    assert notes[3:5] == ["sentence 4: control characters removed", "sentence 5: invalid UTF-8 bytes replaced by U+FFFD"]
    assert hub.translate("Open the file.", beam=1) == out[0]  # one string in, one string out
