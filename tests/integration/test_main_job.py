"""The main job's --quick mode end to end, its resumability and its refusals."""

import json
import shutil

import pytest

from fairseq_capsagg.pipeline import corpus as corpus_mod
from fairseq_capsagg.pipeline.experiment import QUICK
from helpers import TINY_CORPUS, main_job


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("quick")
    return workdir, main_job("--quick", "--workdir", str(workdir))


def test_quick_main_job_writes_the_table(quick_run):
    workdir, result = quick_run
    rows = json.loads((workdir / "results.json").read_text())["rows"]
    assert [r["system"] for r in rows] == ["baseline", "emrouting", "baseline", "emrouting"]
    updates = QUICK["max_update"]
    assert rows[0]["updates"] == updates and rows[1]["updates"] == updates and rows[2]["updates"] > updates
    assert rows[3]["updates"] > updates  # the baseline's updates + the warm-started ones
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
    identity = [f"transformer_{family}_small" for family in ("linagg", "dyncomb", "dwa", "depthattn", "mudd", "hc", "mhc")]
    assert set(step0) == {"baseline", *identity, *routing, "transformer_dlcl_small",
                          *[f"{arch} ({start})" for arch in routing for start in ("identity", "identity + ramp")]}
    # identity-preserving aggregators and dense connections start exactly where the baseline is
    for arch in identity:
        assert step0[arch]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4), arch
    for arch in routing:
        # the ramp starts at the top layer exactly; the identity start alone is closer than a random one
        assert step0[f"{arch} (identity + ramp)"]["loss"] == pytest.approx(step0["baseline"]["loss"], abs=1e-4)
    em = "transformer_emrouting_small"
    assert abs(step0[f"{em} (identity)"]["loss"] - step0["baseline"]["loss"]) < \
        abs(step0[em]["loss"] - step0["baseline"]["loss"])
    table = (workdir / "results.md").read_text()
    assert f"| 2 | + EM Routing (small) | {updates} |" in table
    for stage in ["corpus", "subwords", "binarise", "train baseline", "train emrouting"]:
        assert f"[main-job] {stage} ..." in result.stdout


def test_rerun_skips_finished_stages(quick_run):
    workdir, _ = quick_run
    before = (workdir / "results.json").read_text()
    result = main_job("--quick", "--workdir", str(workdir))
    assert "train emrouting: done already, skipped" in result.stdout
    assert "translate and score emrouting: done already, skipped" in result.stdout
    assert json.loads(before)["rows"][1]["bleu"] == json.loads((workdir / "results.json").read_text())["rows"][1]["bleu"]


def test_binarisation_stopped_half_way_is_redone(quick_run, tmp_path):
    workdir = tmp_path / "copy"
    shutil.copytree(quick_run[0], workdir)
    stages = json.loads((workdir / "stages.json").read_text())
    del stages["binarise"]  # stopped after fairseq-preprocess wrote the dictionaries, before the stage ended
    (workdir / "stages.json").write_text(json.dumps(stages))
    for binary in (workdir / "data-bin").glob("valid.*"):
        binary.unlink()
    result = main_job("--quick", "--workdir", str(workdir))
    assert "[main-job] binarise: finished" in result.stdout
    assert sorted(p.name for p in (workdir / "data-bin").iterdir()) == \
        sorted(p.name for p in (quick_run[0] / "data-bin").iterdir())


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
    bundled = corpus_mod.bundled_corpus(("en", "de"))
    truncated.write_bytes(bundled.tarball.read_bytes()[:100000])
    with pytest.raises(corpus_mod.CorpusError, match="damaged or truncated"):
        corpus_mod.unpack_tarball(truncated, tmp_path / "out", bundled.sha256)
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
