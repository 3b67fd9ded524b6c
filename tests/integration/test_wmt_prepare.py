"""The WMT preparation script on a small local sample (the download itself needs a network)."""

import subprocess
import sys


from helpers import ROOT, TINY_CORPUS


SCRIPT = ROOT / "examples" / "wmt" / "prepare_wmt.py"


def test_prepare_wmt_on_a_local_sample(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text((TINY_CORPUS / f"{split}.{lang}").read_text())
    # pairs the cleaner must drop: empty side, over-long, badly mismatched lengths
    with open(raw / "train.en", "a") as fe, open(raw / "train.de", "a") as fd:
        fe.write("\n" + "word " * 300 + "\n" + "a\n")
        fd.write("leer\n" + "Wort " * 300 + "\n" + "ein sehr viel zu langer Satz für ein einziges Wort hier\n")
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(SCRIPT), "--raw-dir", str(raw), "--src", "en", "--tgt", "de",
                             "--out-dir", str(out), "--vocab-size", "300", "--workers", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[wmt] 400 training pairs after cleaning" in result.stdout
    assert (out / "data-bin" / "train.en-de.en.bin").exists()
    assert (out / "data-bin" / "dict.de.txt").exists()
    assert len((out / "spm.test.de").read_text().splitlines()) == 40


def test_prepare_wmt_names_missing_files(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), "--raw-dir", str(tmp_path), "--src", "zh", "--tgt", "en",
                             "--out-dir", str(tmp_path / "out")], capture_output=True, text=True)
    assert result.returncode == 2
    assert "train.zh is missing: run the download script first" in result.stderr
