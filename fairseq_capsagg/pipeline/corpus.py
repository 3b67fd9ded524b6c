"""Locating, verifying and unpacking the parallel corpus."""

import hashlib
import lzma
import tarfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TARBALL = REPO / "data" / "debian-ende-v1.tar.xz"
DEFAULT_SHA256 = "14e607bb787e358705752662d3e479116d2dae72657fc7f3142deafc886ea093"
SPLITS = ("train", "valid", "test")
LANGS = ("en", "de")


class CorpusError(RuntimeError):
    """The corpus is missing, truncated or inconsistent."""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def unpack_tarball(tarball: Path, dest: Path, expected_sha256: str = DEFAULT_SHA256) -> Path:
    """Checks the tarball's checksum, then unpacks it into ``dest``."""
    if not tarball.is_file():
        raise CorpusError(f"corpus tarball {tarball} not found; pass --corpus DIR, or restore it in "
                          "the repository (git checkout data/): an installed wheel does not carry it")
    if expected_sha256 and sha256(tarball) != expected_sha256:
        raise CorpusError(f"corpus tarball {tarball} is damaged or truncated: its sha256 is not "
                          f"{expected_sha256} (see data/MANIFEST.md)")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball, "r:xz") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, lzma.LZMAError, EOFError) as e:
        raise CorpusError(f"corpus tarball {tarball} cannot be unpacked: {e}") from e
    return dest


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check_corpus_dir(corpus: Path) -> Dict[str, int]:
    """Verifies {train,valid,test}.{en,de} exist, are non-empty and line up.

    Returns:
        the number of sentence pairs of each split.
    """
    problems: List[str] = []
    sizes: Dict[str, int] = {}
    for split in SPLITS:
        counts = {}
        for lang in LANGS:
            path = corpus / f"{split}.{lang}"
            if not path.is_file():
                problems.append(f"{path} is missing")
                continue
            counts[lang] = count_lines(path)
            if counts[lang] == 0:
                problems.append(f"{path} is empty")
        if len(counts) == 2 and counts["en"] != counts["de"]:
            problems.append(f"{split}.en has {counts['en']} lines but {split}.de has {counts['de']}")
        sizes[split] = counts.get("en", 0)
    if problems:
        raise CorpusError("corpus " + str(corpus) + " is unusable: " + "; ".join(problems))
    return sizes
