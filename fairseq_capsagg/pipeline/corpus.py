"""Locating, verifying and unpacking the parallel corpus."""

import hashlib
import lzma
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[2]
SPLITS = ("train", "valid", "test")
#: (source, target) language codes, the suffixes of the corpus files.
Pair = Tuple[str, str]


@dataclass(frozen=True)
class CorpusTarball:
    """A corpus tarball and its sha256 ("" for a user's tarball, which is not checked)."""

    tarball: Path
    sha256: str

    @property
    def name(self) -> str:
        """The corpus' name: the tarball's without its version and suffixes (``debian-ende``)."""
        return self.tarball.name.split("-v")[0]


#: The default language pair of the tables (the paper's Table 1 task); work directories of this pair do
#: not record it in their configuration.
DEFAULT_PAIR: Pair = ("en", "de")
#: The corpora carried in the repository's ``data/`` (``data/MANIFEST.md``), by language pair;
#: ``--source-lang``/``--target-lang`` choose one.
BUNDLED: Dict[Pair, CorpusTarball] = {
    ("en", "de"): CorpusTarball(REPO / "data" / "debian-ende-v1.tar.xz",
                                "14e607bb787e358705752662d3e479116d2dae72657fc7f3142deafc886ea093"),
    ("zh", "en"): CorpusTarball(REPO / "data" / "debian-zhen-v1.tar.xz",
                                "f45e1c7d485f7921eebddff9476c27b34f81d1e0d8557caf261986df69315b85"),
}


class CorpusError(RuntimeError):
    """The corpus is missing, truncated or inconsistent."""


def sha256(path: Path) -> str:
    """The SHA-256 of the file at ``path`` in hex, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundled_corpus(pair: Pair) -> CorpusTarball:
    """The bundled corpus of ``pair``; for another pair, says which exist and what to pass."""
    if pair not in BUNDLED:
        raise CorpusError(
            f"no bundled corpus for {pair[0]}->{pair[1]} (bundled: "
            f"{', '.join(f'{s}->{t}' for s, t in BUNDLED)}); pass --corpus with "
            f"{{train,valid,test}}.{{{pair[0]},{pair[1]}}}")
    return BUNDLED[pair]


def unpack_tarball(tarball: Path, dest: Path, expected_sha256: Optional[str]) -> Path:
    """Checks the tarball's checksum (unless None or empty), then unpacks it into ``dest``.

    Returns:
        the directory that holds the files: ``dest``, or the tarball's one top-level folder.
    """
    if not tarball.is_file():
        raise CorpusError(f"corpus tarball {tarball} not found; pass --corpus DIR, or restore it in "
                          "the repository (git checkout data/): an installed wheel does not carry it")
    if expected_sha256 and sha256(tarball) != expected_sha256:
        raise CorpusError(f"corpus tarball {tarball} is damaged or truncated: its sha256 is not "
                          f"{expected_sha256} (see data/MANIFEST.md)")
    dest.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball, "r:*") as tar:
            tar.extractall(dest, filter="data")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        raise CorpusError(f"corpus tarball {tarball} cannot be unpacked: {e}") from e
    entries = list(dest.iterdir())
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def corpus_languages(corpus: Path) -> List[str]:
    """The language suffixes of the training files in ``corpus`` (``train.en``, ``train.de``, ...)."""
    return sorted({p.suffix[1:] for p in corpus.glob("train.*")} - {"origin"})


def count_lines(path: Path) -> int:
    """Lines of ``path``, read as bytes (a last line without a newline counts; bytes that are not UTF-8 too)."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def check_corpus_dir(corpus: Path, pair: Pair) -> Dict[str, int]:
    """Verifies {train,valid,test}.{source,target} exist, are non-empty and line up.

    Returns:
        the number of sentence pairs of each split.
    """
    if not corpus.is_dir():
        raise CorpusError(f"corpus {corpus} is not a directory (or a .tar.* file)")
    problems: List[str] = []
    sizes: Dict[str, int] = {}
    for split in SPLITS:
        counts = {}
        for lang in pair:
            path = corpus / f"{split}.{lang}"
            if not path.is_file():
                problems.append(f"{path} is missing")
                continue
            counts[lang] = count_lines(path)
            if counts[lang] == 0:
                problems.append(f"{path} is empty")
        if len(counts) == 2 and counts[pair[0]] != counts[pair[1]]:
            problems.append(f"{split}.{pair[0]} has {counts[pair[0]]} lines but {split}.{pair[1]} has "
                            f"{counts[pair[1]]}")
        sizes[split] = counts.get(pair[0], 0)
    if problems:
        found = corpus_languages(corpus)
        languages = (f"; its training files are in {', '.join(found)} (--source-lang/--target-lang are "
                     f"{pair[0]}/{pair[1]})") if found and set(found) != set(pair) else ""
        raise CorpusError("corpus " + str(corpus) + " is unusable: " + "; ".join(problems) + languages)
    return sizes
