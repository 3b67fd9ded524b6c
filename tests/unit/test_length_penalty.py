"""Tuning beam search's length penalty: the choice of value and the flag fairseq-generate gets."""

from pathlib import Path

import pytest

from fairseq_capsagg.analysis import scoring
from fairseq_capsagg.pipeline import fairseq_runs, length_penalty
from fairseq_capsagg.pipeline.experiment import MAX_LEN
from fairseq_capsagg.pipeline.rows import Decoding, Row, hypothesis_file, tune_row, tuned_table


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

    def fake_run_generate(args, log, hyp_file):
        seen["args"] = list(args)
        hyp_file.write_text("Translated 1 sentences (1 tokens) in 1.0s (1.00 sentences/s, 1.0 tokens/s)\n")
        log.write_text("")

    monkeypatch.setattr(fairseq_runs, "run_generate", fake_run_generate)
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


REFERENCES = ["the cat sat on the mat", "a dog ran in the park"]


def nbest_lines(sentence: int, hypotheses) -> str:
    """``fairseq-generate --nbest`` lines of one sentence: (text, log-probability, length with EOS) each, best
    first at lenpen 1, scored as fairseq prints them (per token)."""
    ranked = sorted(hypotheses, key=lambda h: -h[1] / h[2])
    return "".join(f"H-{sentence}\t{lp / n}\t{text}\nD-{sentence}\t{lp / n}\t{text}\n"
                   f"P-{sentence}\t{' '.join(['%.4f' % (lp / n)] * n)}\n" for text, lp, n in ranked)


def _tune(monkeypatch, tmp_path: Path, best: float):
    """tune_row over lenpen 1 and 2 with a fake n-best fairseq-generate whose validation BLEU is highest at
    ``best``; returns the tuned result, the decodings asked for ((subset, lenpen, flags) each) and the tuned
    hypothesis file."""
    from argparse import Namespace

    from fairseq_capsagg.pipeline.experiment import Stages

    decodings = []

    def fake_generate(data_bin, checkpoint, hyp_file, log, hparams, subset="test", extra=()):
        lenpen = hparams.get("lenpen", length_penalty.FAIRSEQ_LENPEN)
        decodings.append((subset, lenpen, tuple(extra)))
        if subset == "valid":  # the reference, 7 tokens, beside "the": first at lenpen 1 only when ``best`` is 1
            lp = -0.6 if best == 1.0 else -4.2
            hyp_file.write_text("".join(nbest_lines(i, [(ref, lp, 7), ("the", -1.0, 2)])
                                        for i, ref in enumerate(REFERENCES)))
        else:
            hyp_file.write_text("".join(f"D-{i}\t-0.5\t{h}\n" for i, h in enumerate(REFERENCES)))
        log.write_text("")
        return 1.0

    monkeypatch.setattr(fairseq_runs, "generate", fake_generate)
    for directory in ("translations/lenpen", "logs"):
        (tmp_path / directory).mkdir(parents=True)
    decoded = hypothesis_file(tmp_path, "row")
    decoded.write_text("".join(f"D-{i}\t-0.5\tdecoded at the default {i}\n" for i in range(2)))
    args = Namespace(workdir=tmp_path, lenpen_grid=[1.0, 2.0])
    stages = Stages(tmp_path)
    try:
        decoding = Decoding(tmp_path, {"beam": 2}, REFERENCES, 2, REFERENCES)
        tuned = tune_row(Row("row", "baseline", "scratch", 1, "row"), args, decoding, stages, tmp_path / "m.pt", decoded)
    finally:
        stages.close()
    return tuned, decodings, hypothesis_file(tmp_path, "row.lenpen")


def test_a_tuned_default_length_penalty_reuses_the_default_decoding(monkeypatch, tmp_path):
    tuned, decodings, hyp_file = _tune(monkeypatch, tmp_path, best=1.0)
    assert tuned["lenpen"] == 1.0 and decodings == [("valid", 1.0, ("--nbest", "2"))]  # the test split not again
    assert hyp_file.read_text() == (tmp_path / "translations" / "row.txt").read_text()


def test_another_tuned_length_penalty_decodes_the_test_split_with_it(monkeypatch, tmp_path):
    tuned, decodings, hyp_file = _tune(monkeypatch, tmp_path, best=2.0)
    assert tuned["lenpen"] == 2.0 and decodings == [("valid", 1.0, ("--nbest", "2")), ("test", 2.0, ())]
    assert tuned["valid_bleu"]["2"] == pytest.approx(100.0) and tuned["valid_bleu"]["1"] < 10
    assert tuned["bleu"] == pytest.approx(100.0) and tuned["untranslated_ids"] == []


def test_rerank_takes_beam_searchs_choice_at_each_length_penalty(tmp_path):
    """Scores as fairseq prints them (per token, at lenpen 1); the choice at lenpen a is the highest
    log p / length ** a, and its score is the one fairseq prints at a."""
    nbest_file = tmp_path / "nbest.txt"
    nbest_file.write_text(nbest_lines(0, [("short", -2.0, 2), ("a longer one", -4.5, 4), ("longest of all", -9.0, 6)])
                          + nbest_lines(3, [("", -0.25, 1)]) + "Translated 2 sentences\n")
    nbest = scoring.read_nbest(nbest_file)
    assert [h.length for h in nbest[0]] == [2, 4, 6] and nbest[3] == [scoring.Hypothesis("", -0.25, 1)]
    for lenpen in (0.5, 1.0, 1.5, 2.0, 3.0):
        chosen = length_penalty.rerank(nbest, lenpen)
        best = max([("short", -2.0, 2), ("a longer one", -4.5, 4), ("longest of all", -9.0, 6)],
                   key=lambda h: h[1] / h[2] ** lenpen)
        assert chosen[0].text == best[0] and chosen[0].score == pytest.approx(best[1] / best[2] ** lenpen)
        assert chosen[3].text == ""
    assert length_penalty.rerank(nbest, 0.5)[0].text == "short"
    assert length_penalty.rerank(nbest, 3.0)[0].text == "longest of all"


def test_rerank_keeps_fairseqs_order_between_equal_scores():
    tied = {0: [scoring.Hypothesis("first", -1.0, 4), scoring.Hypothesis("second", -1.0, 4)]}
    assert length_penalty.rerank(tied, 2.0)[0].text == "first"


def test_the_tuned_table_says_what_the_tuning_moved_on_valid_and_on_test():
    """One table for Table 1 and the converged comparison: the validation BLEU at fairseq's default and at the
    row's own value, that value, and the test scores decoded with it against the tuned reference row."""
    rows = [Row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
            Row("scratch-dyncomb-s1", "dyncomb", "scratch", 1, "scratch-baseline-s1"),
            Row("scratch-mudd-s1", "mudd", "scratch", 1, "scratch-baseline-s1")]
    test_scores = {"chrf": 25.0, "brevity_penalty": 0.87, "length_ratio": 0.88}
    results = {"scratch-baseline-s1": {"tuned": {"lenpen": 1.5, "valid_bleu": {"1": 7.47, "1.5": 8.04},
                                                 "bleu": 7.92, **test_scores}},
               "scratch-dyncomb-s1": {"tuned": {"lenpen": 2.0, "valid_bleu": {"2": 11.0}, "bleu": 10.5, **test_scores,
                                                "delta_bleu": 2.58, "bootstrap_p": 0.001, "sign_p": 1e-9,
                                                "sign_better": 700, "sign_worse": 400}},
               "scratch-mudd-s1": {"bleu": 10.46}}  # decoded at the default length penalty only
    lines = tuned_table(rows, results, [2.0, 0.5, 1.5], decoded=", from its best checkpoint")
    assert lines[0] == ("### Length penalty tuned on the validation split, each row on its own, from its best "
                        "checkpoint (`--lenpen` from 2, 0.5, 1.5; against the row named in its protocol's title, "
                        "also tuned)")
    assert lines[4:] == ["| scratch-baseline-s1 | 7.47 → 8.04 | 1.5 | 7.92 | – | 0.87 (0.88) | 25.00 | – | – |",
                         "| scratch-dyncomb-s1 | – → 11.00 | 2 | 10.50† | +2.58 | 0.87 (0.88) | 25.00 | 0.001 "
                         "| 1e-09 (700/400) |", ""]
    assert tuned_table(rows, {"scratch-mudd-s1": {"bleu": 10.46}}, [1.0]) == []
