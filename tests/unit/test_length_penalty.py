"""Tuning beam search's length penalty: the choice of value and the flag fairseq-generate gets."""

from pathlib import Path

import pytest

from fairseq_capsagg.pipeline import fairseq_runs, length_penalty
from fairseq_capsagg.pipeline.experiment import MAX_LEN


@pytest.mark.parametrize("valid_bleu, best", [
    ({0.5: 7.1, 1.0: 7.4, 2.0: 7.9}, 2.0),     # the highest validation BLEU wins
    ({0.5: 7.9, 1.0: 7.4, 2.0: 7.9}, 0.5),     # a tie goes to the value nearest fairseq's default 1.0
    ({0.5: 7.4, 1.0: 7.4, 1.5: 7.4}, 1.0),     # a flat curve keeps fairseq's default
    ({2.0: 3.0, 3.0: 3.0}, 2.0),               # without 1.0 in the grid, still the nearest to it
])
def test_best_length_penalty(valid_bleu, best):
    assert length_penalty.best_length_penalty(valid_bleu) == best


def _generate_args(monkeypatch, tmp_path: Path, **extra) -> list:
    seen = {}

    def fake_run_logged(tool, args, log, stdout_file=None):
        seen["args"] = list(args)
        stdout_file.write_text("Translated 1 sentences (1 tokens) in 1.0s (1.00 sentences/s, 1.0 tokens/s)\n")
        log.write_text("")
        return 1.0

    monkeypatch.setattr(fairseq_runs, "run_logged", fake_run_logged)
    hparams = {"pair": ("en", "de"), "beam": 4, "decode_batch": 8, "remove_bpe": "sentencepiece",
               "device_flags": ["--cpu"], "max_len": MAX_LEN, **extra}
    fairseq_runs.generate(tmp_path, tmp_path / "m.pt", tmp_path / "hyp.txt", tmp_path / "log", hparams)
    return seen["args"]


def test_generate_passes_the_length_penalty_only_when_given(monkeypatch, tmp_path):
    args = _generate_args(monkeypatch, tmp_path, lenpen=2.5)
    assert args[args.index("--lenpen") + 1] == "2.5"
    assert "--lenpen" not in _generate_args(monkeypatch, tmp_path)


def test_generate_passes_the_longest_hypothesis(monkeypatch, tmp_path):
    args = _generate_args(monkeypatch, tmp_path, max_len=(0.0, 32))
    assert (args[args.index("--max-len-a") + 1], args[args.index("--max-len-b") + 1]) == ("0.0", "32")
