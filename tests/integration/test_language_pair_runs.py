"""Any language pair through the main job: the bundled Chinese->English corpus, subword-nmt subwords end to
end (generate, interactive, hub, capsagg-translate), the quick subwords of every bundled pair, and one
error line for a corpus or setting that cannot work."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import BIN, TINY_CORPUS, main_job, table1

from fairseq_capsagg import USER_DIR
from fairseq_capsagg.pipeline.data import prepare_data, unpack_corpus
from fairseq_capsagg.pipeline.experiment import QUICK, Stages
from fairseq_capsagg.pipeline import subwords
from fairseq_capsagg.pipeline.corpus import BUNDLED, unpack_tarball
from fairseq_capsagg.pipeline.subwords import SubwordModel
from fairseq_capsagg.analysis import scoring

CHINESE = ["打开文件。", "无法创建文件 %s", "保存文档"]


@pytest.mark.parametrize("flags, message", [
    (["--corpus", str(TINY_CORPUS), "--source-lang", "zh", "--target-lang", "en"],
     r"corpus .* is unusable: .*train\.zh is missing.*its training files are in de, en \(--source-lang/--target-lang are zh/en\)"),
    (["--source-lang", "fr", "--target-lang", "en"],
     r"no bundled corpus for fr->en \(bundled: en->de, zh->en\); pass --corpus with \{train,valid,test\}\.\{fr,en\}"),
    (["--subwords", "wordpiece"],
     r"argument --subwords: invalid choice: 'wordpiece' \(choose from 'sentencepiece', 'subword-nmt'\)"),
    (["--bpe-merges", "100"], r"--bpe-merges 100: a positive number of merges, with --subwords subword-nmt"),
    (["--source-lang", "de", "--target-lang", "de"], r"--source-lang and --target-lang are both 'de'"),
])
def test_bad_pair_or_subwords_is_one_error_line(flags, message, tmp_path):
    result = main_job(*flags, "--workdir", str(tmp_path / "work"), check=False)
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert re.search(r"main_job: error: " + message, errors[0]), errors[0]
    assert not (tmp_path / "work" / "corpus").exists() and not (tmp_path / "work" / "config.json").exists()


def test_mismatched_line_counts_in_another_pair(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        shutil.copy(TINY_CORPUS / f"{split}.en", corpus / f"{split}.en")
        shutil.copy(TINY_CORPUS / f"{split}.de", corpus / f"{split}.fr")
    with open(corpus / "test.fr", "a") as f:
        f.write("une ligne de trop\n")
    result = main_job("--corpus", str(corpus), "--source-lang", "fr", "--target-lang", "en",
                      "--workdir", str(tmp_path / "work"), check=False)
    assert result.returncode == 2 and "main_job: error: " in result.stderr
    assert "test.fr has 41 lines but test.en has 40" in result.stderr


@pytest.fixture(scope="module")
def chinese_quick_run(tmp_path_factory):
    """The Chinese->English pair, --quick, subword-nmt subwords, EM routing only."""
    workdir = tmp_path_factory.mktemp("zhen")
    main_job("--quick", "--source-lang", "zh", "--target-lang", "en", "--subwords", "subword-nmt",
             "--systems", "emrouting", "--no-equal-time", "--workdir", str(workdir))
    return workdir


def test_chinese_english_quick_run_with_subword_nmt(chinese_quick_run):
    workdir = chinese_quick_run
    results = json.loads((workdir / "results.json").read_text())
    assert "tok:13a" in results["sacrebleu"]["bleu"] and "nrefs:1" in results["sacrebleu"]["chrf"]
    assert results["caption"].startswith("zh->en, test split of the bundled debian-zhen corpus")
    assert "subword-nmt subwords" in results["caption"] and "tok:13a" in results["caption"]
    assert results["rows"][0]["system"] == "emrouting" and 0 <= results["rows"][0]["bleu"] <= 100
    assert (workdir / "data-bin" / "dict.zh.txt").exists() and (workdir / "bpe" / "bpe.codes").exists()
    assert "@@ " in (workdir / "bpe" / "train.zh").read_text(encoding="utf-8")
    hypotheses = [line for line in (workdir / "translations" / "emrouting.txt").read_text().splitlines()
                  if line.startswith("D-")]
    # every test sentence decoded (60: fairseq's default batch multiple, 8, would leave out the longest 4)
    assert len(hypotheses) == 60 and results["rows"][0]["untranslated_ids"] == []
    assert not any("@@" in line for line in hypotheses)  # --remove-bpe subword_nmt


def test_subword_nmt_model_in_interactive_hub_and_translate(chinese_quick_run):
    workdir = chinese_quick_run
    checkpoint = workdir / "checkpoints" / "emrouting" / "checkpoint_last.pt"
    codes = workdir / "bpe" / "bpe.codes"
    interactive = subprocess.run(
        [str(BIN / "fairseq-interactive"), str(workdir / "data-bin"), "--user-dir", USER_DIR, "--path",
         str(checkpoint), "--source-lang", "zh", "--target-lang", "en", "--bpe", "subword_nmt", "--bpe-codes",
         str(codes), "--beam", "2", "--max-len-b", "8", "--cpu"],
        input="\n".join(CHINESE) + "\n", capture_output=True, text=True, timeout=300)
    assert interactive.returncode == 0, interactive.stderr[-2000:]
    sources = re.findall(r"^S-\d+\t(.*)$", interactive.stdout, flags=re.M)
    assert len(sources) == 3 and all("@@" in s for s in sources)  # the codes segment the Chinese input
    assert len(re.findall(r"^D-\d+\t", interactive.stdout, flags=re.M)) == 3
    assert not any("@@" in line for line in re.findall(r"^D-\d+\t.*$", interactive.stdout, flags=re.M))

    from fairseq_capsagg.tools.hub import from_pretrained

    hub = from_pretrained(checkpoint.parent, checkpoint.name, data_name_or_path=workdir / "data-bin",
                          bpe="subword_nmt", bpe_codes=str(codes))
    out = hub.translate(CHINESE, beam=2)
    assert len(out) == 3 and all(isinstance(s, str) and "@@" not in s for s in out)

    translated = subprocess.run(
        [str(BIN / "capsagg-translate"), "--model-dir", str(checkpoint.parent), "--checkpoint", checkpoint.name,
         "--data", str(workdir / "data-bin"), "--bpe-codes", str(codes), "--beam", "2"],
        input="\n".join(CHINESE) + "\n", capture_output=True, text=True, timeout=300)
    assert translated.returncode == 0, translated.stderr[-2000:]
    assert translated.stdout.split("\n")[:3] == out


@pytest.mark.parametrize("pair,method", [(("zh", "en"), "sentencepiece"), (("en", "de"), "subword-nmt")])
def test_quick_subwords_and_binarisation_fit_every_bundled_pair(pair, method, tmp_path):
    """The pair and subword combinations the quick main-job runs do not cover: a Chinese side has more
    characters than --quick's 1,000 pieces, so sentencepiece learns its smallest vocabulary for them."""
    stages = Stages(tmp_path)
    corpus_dir = unpack_corpus(BUNDLED[pair], tmp_path / "corpus", pair, stages)
    data_bin = prepare_data(tmp_path, corpus_dir, pair, method, QUICK["vocab_size"], 64, True, stages)
    learnt = stages.done["subwords"]["vocab_size"]
    assert learnt > 1000 if method == "sentencepiece" else learnt == 1000
    sizes = {split: n for split, n in stages.done["subwords"].items() if split != "vocab_size"}
    assert sizes["valid"] == sizes["test"] == 60 and 0 < sizes["train"] <= 3000
    assert all((data_bin / f"dict.{lang}.txt").is_file() for lang in pair)


def small_chinese_corpus(directory: Path, lines: int = 300) -> Path:
    """The first ``lines`` pairs of every split of the bundled Chinese-English corpus."""
    full = unpack_tarball(BUNDLED[("zh", "en")].tarball, directory / "full", BUNDLED[("zh", "en")].sha256)
    small = directory / "small"
    small.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("zh", "en"):
            (small / f"{split}.{lang}").write_text(
                "\n".join(scoring.read_lines(full / f"{split}.{lang}")[:lines]) + "\n", encoding="utf-8")
    return small


def test_a_vocabulary_below_the_corpus_characters_is_one_error_line_naming_the_smallest(tmp_path):
    corpus = small_chinese_corpus(tmp_path)
    result = main_job("--source-lang", "zh", "--target-lang", "en", "--corpus", str(corpus), "--vocab-size", "100",
                      "--workdir", str(tmp_path / "work"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    match = re.search(r"main_job: error: --vocab-size 100 cannot hold the characters of this corpus: at character "
                      r"coverage 0\.9995 sentencepiece needs at least (\d+) pieces; use --vocab-size \1 or more",
                      result.stderr)
    assert match, result.stderr[-2000:]
    smallest = int(match.group(1))
    model = SubwordModel("sentencepiece", tmp_path / "spm" / "spm.model")
    assert subwords.learn(model, corpus, ("zh", "en"), smallest) == smallest  # the value named works
    with pytest.raises(subwords.VocabularyTooSmall):
        subwords.learn(model, corpus, ("zh", "en"), smallest - 1)


def test_table1_names_the_smallest_vocabulary_in_one_error_line(tmp_path):
    result = table1("--vocab-size", "50", "--workdir", str(tmp_path / "w"), check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.search(r"table1: error: --vocab-size 50 cannot hold the characters of this corpus: at character "
                     r"coverage 1 sentencepiece needs at least \d+ pieces; use --vocab-size \d+ or more", result.stderr)


def test_table1_runs_the_converged_comparison_on_chinese_english(tmp_path):
    """The converged comparison's first row on the bundled Zh->En corpus (--quick): published apart from
    En->De's tables, its caption naming the corpus and the direction, every test sentence decoded."""
    workdir, publish = tmp_path / "w", tmp_path / "published"
    table1("--quick", "--table", "converged", "--source-lang", "zh", "--target-lang", "en",
           "--workdir", str(workdir), "--rows", "converged-baseline-s1", "--publish", str(publish))
    assert sorted(p.name for p in publish.iterdir()) == ["converged-zhen-cpu.json", "converged-zhen-cpu.md",
                                                         "converged-zhen-curves.png"]
    payload = json.loads((publish / "converged-zhen-cpu.json").read_text())
    assert payload["caption"].startswith("Test split of the bundled debian-zhen corpus (zh->en, 60 sentences")
    assert payload["config"]["source_lang"] == "zh" and payload["config"]["target_lang"] == "en"
    row = payload["results"]["converged-baseline-s1"]
    assert row["bleu"] >= 0 and 0 <= row["references"]["search_error_share"] <= 1
    hypotheses = scoring.read_generate_output(workdir / "translations" / "converged-baseline-s1.txt")
    assert sorted(hypotheses) == list(range(60)) and row["untranslated_ids"] == []
