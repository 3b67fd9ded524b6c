"""The main job's --quick mode end to end, its resumability and its refusals."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, TINY_CORPUS

sys.path.insert(0, str(ROOT / "examples"))
from pipeline import corpus as corpus_mod  # noqa: E402

MAIN_JOB = ROOT / "examples" / "main_job.py"


def main_job(*args, check=True):
    result = subprocess.run([sys.executable, str(MAIN_JOB), *args], capture_output=True, text=True,
                            timeout=900)
    if check and result.returncode != 0:
        raise AssertionError(result.stdout[-3000:] + result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quick")
    return workdir, main_job("--quick", "--workdir", str(workdir))


def test_quick_main_job_writes_the_table(quick_run):
    workdir, result = quick_run
    rows = json.loads((workdir / "results.json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["baseline", "emrouting", "baseline", "emrouting"]
    assert rows[0]["updates"] == 40 and rows[1]["updates"] == 40 and rows[2]["updates"] > 40
    assert rows[3]["updates"] > 40  # 40 baseline updates + the warm-started ones
    assert rows[1]["params"] > rows[0]["params"] == rows[2]["params"]
    assert rows[3]["params"] == rows[1]["params"]
    for row in rows:
        assert 0 <= row["bleu"] <= 100 and row["chrf"] > 0
        assert row["updates_per_s"] > 0 and row["decode_sentences_per_s"] > 0
    assert 0 <= rows[1]["bootstrap_p"] <= 1 and 0 <= rows[1]["sign_p"] <= 1
    # the equal wall-clock rows were planned to use EM routing's training time
    assert rows[2]["train_seconds"] > rows[0]["train_seconds"] and rows[3]["train_seconds"] > rows[0]["train_seconds"]
    step0 = json.loads((workdir / "results.json").read_text())["warm_start_step0"]
    routing = ["transformer_dynrouting_small", "transformer_emrouting_small"]
    assert set(step0) == {"baseline", "transformer_linagg_small", "transformer_dyncomb_small", *routing,
                          *[f"{arch} ({start})" for arch in routing for start in ("identity", "identity + ramp")]}
    # identity-preserving aggregators start exactly where the baseline is
    assert step0["transformer_dyncomb_small"]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4)
    assert step0["transformer_linagg_small"]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4)
    for arch in routing:
        # the ramp starts at the top layer exactly; the identity start alone is closer than a random one
        assert step0[f"{arch} (identity + ramp)"]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4)
    em = "transformer_emrouting_small"
    assert abs(step0[f"{em} (identity)"]["loss"] - step0["baseline"]["loss"]) < \
        abs(step0[em]["loss"] - step0["baseline"]["loss"])
    table = (workdir / "results.md").read_text()
    assert "| 2 | + EM Routing (small) | 40 |" in table
    for stage in ["corpus", "subwords", "binarise", "train baseline", "train emrouting"]:
        assert f"[main-job] {stage} ..." in result.stdout


def test_rerun_skips_finished_stages(quick_run):
    workdir, _ = quick_run
    before = (workdir / "results.json").read_text()
    result = main_job("--quick", "--workdir", str(workdir))
    assert "train emrouting: done already, skipped" in result.stdout
    assert "translate and score emrouting: done already, skipped" in result.stdout
    assert json.loads(before)["rows"][1]["bleu"] == json.loads((workdir / "results.json").read_text())["rows"][1]["bleu"]


def test_other_configuration_in_the_same_workdir_is_refused(quick_run):
    workdir, _ = quick_run
    checkpoint = workdir / "checkpoints" / "emrouting" / "checkpoint_last.pt"
    stamp = checkpoint.stat().st_mtime
    result = main_job("--quick", "--workdir", str(workdir), "--lr", "0.01", check=False)
    assert result.returncode == 2
    assert "holds results of another configuration (lr: 0.002 -> 0.01)" in result.stderr
    assert checkpoint.stat().st_mtime == stamp


def test_truncated_tarball_is_refused(tmp_path):
    truncated = tmp_path / "corpus.tar.xz"
    truncated.write_bytes(corpus_mod.DEFAULT_TARBALL.read_bytes()[:100000])
    with pytest.raises(corpus_mod.CorpusError, match="damaged or truncated"):
        corpus_mod.unpack_tarball(truncated, tmp_path / "out")
    with pytest.raises(corpus_mod.CorpusError, match="cannot be unpacked"):
        corpus_mod.unpack_tarball(truncated, tmp_path / "out", expected_sha256="")


def test_mismatched_or_missing_corpus_files_are_refused(tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(TINY_CORPUS, corpus)
    with open(corpus / "valid.de", "a") as f:
        f.write("eine Zeile zu viel\n")
    (corpus / "test.en").unlink()
    result = main_job("--corpus", str(corpus), "--workdir", str(tmp_path / "work"), check=False)
    assert result.returncode == 2
    assert "valid.en has 40 lines but valid.de has 41" in result.stderr
    assert "test.en is missing" in result.stderr
    assert not (tmp_path / "work" / "checkpoints").exists()


def test_hub_loads_and_translates_with_sentencepiece(quick_run):
    from fairseq_capsagg.hub import from_pretrained
    from fairseq_capsagg.models import CapsAggTransformerModel

    workdir, _ = quick_run
    hub = from_pretrained(workdir / "checkpoints" / "emrouting", "checkpoint_last.pt",
                          data_name_or_path=workdir / "data-bin", bpe="sentencepiece",
                          sentencepiece_model=str(workdir / "spm" / "spm.model"))
    assert isinstance(hub.models[0], CapsAggTransformerModel)
    out = hub.translate(["Open the file.", "Save the document as PDF."], beam=2)
    assert len(out) == 2 and all(isinstance(s, str) and "▁" not in s for s in out)


def test_agreement_analysis_of_the_quick_model(quick_run, tmp_path):
    from fairseq_capsagg.analysis.__main__ import main as analysis_main

    workdir, _ = quick_run
    code = analysis_main(["agreement", "--path", str(workdir / "checkpoints" / "emrouting" / "checkpoint_last.pt"),
                          "--data", str(workdir / "data-bin"), "--subset", "test", "--output-dir", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "agreement.json").read_text())
    for side in ("encoder", "decoder"):
        stats = result[side]
        assert stats["positions"] > 500
        assert len(stats["entropy"]) == 3
        assert stats["entropy"][0] == pytest.approx(__import__("math").log(128))  # uniform start, N = d
        assert stats["diversity"][0] == pytest.approx(0.0, abs=1e-6)
        assert (tmp_path / f"agreement-{side}.png").stat().st_size > 20_000


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


def test_translate_survives_every_bad_input(quick_run):
    workdir, _ = quick_run
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
def test_fairseq_interactive_survives_every_bad_input(quick_run, launcher):
    workdir, _ = quick_run
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


def test_hub_translate_survives_every_bad_input(quick_run, caplog):
    from fairseq_capsagg.hub import from_pretrained

    workdir, _ = quick_run
    hub = from_pretrained(workdir / "checkpoints" / "emrouting", "checkpoint_last.pt",
                          data_name_or_path=workdir / "data-bin", bpe="sentencepiece",
                          sentencepiece_model=str(workdir / "spm" / "spm.model"))
    sentences = [line.decode("utf-8", errors="surrogateescape") for line in LINES]  # str, as Python reads it
    with caplog.at_level("WARNING", logger="fairseq_capsagg.hub"):
        out = hub.translate(sentences, beam=1)
        from_bytes = hub.translate(LINES, beam=1)
    assert len(out) == len(LINES) and out == from_bytes
    assert out[0] and out[-1] and out[1] == out[2] == ""
    assert all(out[i] for i in (3, 4, 5, 6))
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 10 and notes[:5] == notes[5:]
    assert notes[:2] == ["sentence 1: empty input, nothing to translate", "sentence 2: empty input, nothing to translate"]
    assert re.fullmatch(r"sentence 3: \d{4} subword tokens, truncated to 1023", notes[2])
    assert notes[3:5] == ["sentence 4: control characters removed", "sentence 5: invalid UTF-8 bytes replaced by U+FFFD"]
    assert hub.translate("Open the file.", beam=1) == out[0]  # one string in, one string out
