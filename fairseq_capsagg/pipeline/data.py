"""The data stages of every experiment: the corpus unpacked and checked, joint subwords learnt and
applied, the splits binarised with fairseq-preprocess."""

import shutil
from pathlib import Path
from typing import List, Tuple

from ..analysis.scoring import read_lines
from . import corpus as corpus_mod
from . import fairseq_runs, stage_names, subwords
from .corpus import Pair
from .experiment import QUICK_LIMITS, Stages


def unpack_corpus(tarball: "corpus_mod.CorpusTarball", dest: Path, pair, stages: "Stages") -> Path:
    """Unpacks (once) and checks a corpus tarball; returns the directory with its files."""
    def unpack():
        directory = corpus_mod.unpack_tarball(tarball.tarball, dest, tarball.sha256)
        corpus_mod.check_corpus_dir(directory, pair)
        return {"directory": str(directory)}

    done = stages.run(stage_names.CORPUS, unpack, dest)
    # work directories from before tarballs with a top-level folder were accepted recorded split sizes only
    return Path(done["directory"]) if "directory" in done else dest


def prepare_data(work: Path, corpus_dir: Path, pair: Pair, method: str, size: int, max_train_tokens: int,
                 quick: bool, stages: Stages) -> Path:
    """Joint subwords (``method``, ``size`` pieces or merges) and binarisation of ``corpus_dir`` into
    ``work``; with ``quick`` the splits are cut to :data:`~.experiment.QUICK_LIMITS` and a
    sentencepiece vocabulary too small for the corpus' characters grows to the smallest that holds them.

    Returns:
        the data-bin directory.

    Raises:
        subwords.VocabularyTooSmall: ``size`` cannot hold the corpus' characters (without ``quick``).
    """
    model = subwords.subword_model(method, work)
    encoded = model.path.parent

    def make_subwords():
        learnt = subwords.learn(model, corpus_dir, pair, size, max_sentences=20000 if quick else 1_000_000,
                                grow_to_fit=quick)
        if learnt != size:
            print(f"[{stages.label}] --quick: {size} subwords cannot hold this corpus' characters; learnt {learnt}, "
                  "sentencepiece's smallest vocabulary for them", flush=True)
        limits = QUICK_LIMITS if quick else None
        return {**subwords.encode_corpus(model, corpus_dir, pair, encoded, max_train_tokens, limits),
                "vocab_size": learnt}

    stages.run(stage_names.SUBWORDS, make_subwords, model.path)
    data_bin = work / "data-bin"

    def binarise():
        # a binarisation stopped half way leaves files that fairseq-preprocess refuses to overwrite
        shutil.rmtree(data_bin, ignore_errors=True)
        fairseq_runs.run_logged("fairseq-preprocess", [
            "--source-lang", pair[0], "--target-lang", pair[1],
            "--trainpref", str(encoded / "train"), "--validpref", str(encoded / "valid"),
            "--testpref", str(encoded / "test"), "--joined-dictionary", "--destdir", str(data_bin),
            "--workers", "2"], work / "logs" / "preprocess.log")
        return {}

    stages.run(stage_names.BINARISE, binarise, data_bin / f"dict.{pair[0]}.txt")
    return data_bin


def references(work: Path, corpus_dir: Path, method: str, lang: str, split: str = "test") -> Tuple[List[str], int]:
    """The raw references of ``split`` in ``lang``, as many as were encoded (``--quick`` cuts them), and
    their number."""
    count = corpus_mod.count_lines(subwords.subword_model(method, work).path.parent / f"{split}.{lang}")
    return read_lines(corpus_dir / f"{split}.{lang}")[:count], count
