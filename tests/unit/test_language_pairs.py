"""Any language pair through the main job: the bundled Chinese->English corpus, subword-nmt subwords
end to end (generate, interactive, hub, capsagg-translate), scoring fit for the target, and one
error line for a corpus or setting that cannot work."""

import math
from pathlib import Path

import pytest

from fairseq_capsagg.pipeline.drivers import table1
from fairseq_capsagg.pipeline.corpus import BUNDLED, check_corpus_dir, unpack_tarball
from fairseq_capsagg.pipeline.subwords import CJK_CHARACTER_COVERAGE, SubwordModel, character_coverage
from fairseq_capsagg.analysis import scoring
from fairseq_capsagg.analysis.scoring import bleu_tokenizer, corpus_scores, signatures


def test_scoring_and_subwords_fit_the_script():
    assert bleu_tokenizer("zh") == "zh" and bleu_tokenizer("en") == bleu_tokenizer("de") == "13a"
    assert "tok:zh" in signatures("zh")["bleu"] and "tok:13a" in signatures("13a")["bleu"]
    # the zh tokenizer splits Chinese characters: an unsegmented hypothesis still gets credit
    assert corpus_scores(["我们打开文件"], ["我们 打开 文件"], "zh")["bleu"] == 100.0
    assert corpus_scores(["我们打开文件"], ["我们 打开 文件"], "13a")["bleu"] == 0.0
    assert character_coverage(("zh", "en")) == character_coverage(("en", "zh")) == CJK_CHARACTER_COVERAGE < 1.0
    assert character_coverage(("en", "de")) == 1.0
    codes = SubwordModel("subword-nmt", Path("bpe.codes"))
    assert codes.fairseq_flags() == ["--bpe", "subword_nmt", "--bpe-codes", "bpe.codes"]
    assert codes.hub_kwargs() == {"bpe": "subword_nmt", "bpe_codes": "bpe.codes"}


def test_bundled_chinese_english_corpus_is_checked_and_lines_up(tmp_path):
    bundled = BUNDLED[("zh", "en")]
    corpus = unpack_tarball(bundled.tarball, tmp_path, bundled.sha256)
    assert check_corpus_dir(corpus, ("zh", "en")) == {"train": 99755, "valid": 993, "test": 2000}


def test_bleu_details_split_bleu_into_precisions_and_brevity():
    references = ["the cat sat on the mat today", "a dog barked twice at night"]
    exact = scoring.bleu_details(references, references)
    assert exact == {"precisions": [100.0] * 4, "brevity_penalty": 1.0, "length_ratio": 1.0}
    short = scoring.bleu_details(["the cat sat on the mat", "a dog barked twice"], references)
    assert short["length_ratio"] == round(10 / 13, 4)
    assert short["brevity_penalty"] == round(math.exp(1 - 13 / 10), 4)
    assert short["precisions"][0] == 100.0


def test_table1_takes_a_bundled_pair_and_keeps_each_pair_apart(capsys):
    """Zh->En gets its own work directory, configuration and published tables; En->De's configuration is
    what work directories from before the flags hold (so they stay usable); another pair is one error line."""
    zhen = table1.parse_args(["--table", "converged", "--source-lang", "zh", "--target-lang", "en"])
    assert zhen.workdir == Path("runs/converged-zhen") and zhen.sacrebleu_tokenize == "13a"
    assert table1.config_of(zhen)["source_lang"] == "zh" and table1.config_of(zhen)["target_lang"] == "en"
    assert table1.pair_suffixed("converged", zhen.pair) == "converged-zhen"
    ende = table1.parse_args(["--table", "converged"])
    assert ende.workdir == Path("runs/converged") and table1.pair_suffixed("converged", ende.pair) == "converged"
    assert "source_lang" not in table1.config_of(ende) and "target_lang" not in table1.config_of(ende)
    assert table1.parse_args(["--source-lang", "zh", "--target-lang", "en"]).workdir == Path("runs/table1-zhen")
    with pytest.raises(SystemExit):
        table1.parse_args(["--source-lang", "de", "--target-lang", "en"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == ["table1: error: --source-lang de --target-lang en: no bundled corpus of that pair; "
                      "choose from en-de, zh-en"]
