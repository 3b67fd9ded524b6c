#!/usr/bin/env python
"""Builds the debian-ende corpus from packages unpacked by fetch_packages.sh.

    python data/rebuild/build_corpus.py WORKDIR/unpacked OUT_DIR

Sources and alignment:
* gettext catalogues (``de/LC_MESSAGES/*.mo``, calibre's locales.zip): msgid -> msgstr;
* LibreOffice help: HTML blocks with the same id in the en-US and de trees;
* GIMP help and the Debian handbook: blocks at the same position of the same page, when the
  page has as many blocks in both languages;
* man pages: roff paragraphs at the same position, when the counts agree;
* Ding (trans-de-en): the example sentences of the dictionary.
Pairs are normalised and filtered (empty, untranslated, > 200 words, character-length ratio outside
0.4-2.5, duplicate English side); valid and test are ~1% each, chosen by hashing the normalised
English side among pairs of >= 4 English words; training pairs sharing either side with a held-out
pair are removed.
"""

import gzip
import hashlib
import re
import struct
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

Pair = Tuple[str, str]
_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def parse_mo(data: bytes) -> List[Pair]:
    """(msgid, msgstr) pairs of a GNU gettext binary catalogue; plural forms keep the singular."""
    if len(data) < 20:
        return []
    endian = "<" if struct.unpack("<I", data[:4])[0] == 0x950412DE else ">"
    _revision, count, ids_at, strs_at = struct.unpack(endian + "4I", data[4:20])
    pairs = []
    for i in range(count):
        id_len, id_off = struct.unpack(endian + "2I", data[ids_at + 8 * i: ids_at + 8 * i + 8])
        str_len, str_off = struct.unpack(endian + "2I", data[strs_at + 8 * i: strs_at + 8 * i + 8])
        msgid = data[id_off: id_off + id_len].decode("utf-8", "replace")
        msgstr = data[str_off: str_off + str_len].decode("utf-8", "replace")
        if not msgid:
            continue  # the catalogue header
        msgid = msgid.split("\x04")[-1].split("\x00")[0]  # drop msgctxt, keep the singular
        pairs.append((msgid, msgstr.split("\x00")[0]))
    return pairs


def clean_ui_string(text: str) -> str:
    """Removes markup, mnemonics (_File, ~Open, &Save) from an interface string."""
    text = re.sub(r"<[^>]+>", " ", text)
    text = text.replace("_", "").replace("~", "")
    return normalise(re.sub(r"&(?=\w)", "", text))


def catalogue_pairs(root: Path) -> Iterator[Pair]:
    for mo in sorted(root.glob("*/**/de/LC_MESSAGES/*.mo")):
        for en, de in parse_mo(mo.read_bytes()):
            yield clean_ui_string(en), clean_ui_string(de)
    for archive in sorted(root.glob("calibre/**/locales.zip")):
        with zipfile.ZipFile(archive) as zf:
            for name in sorted(n for n in zf.namelist() if n.startswith("de/") and n.endswith(".mo")):
                for en, de in parse_mo(zf.read(name)):
                    yield clean_ui_string(en), clean_ui_string(de)


def ding_pairs(path: Path) -> Iterator[Pair]:
    """Example sentences of the Ding dictionary ("de1 | de2 :: en1 | en2" lines)."""
    annotation = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\])")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or " :: " not in line:
                continue
            german, english = line.rstrip("\n").split(" :: ", 1)
            for de, en in zip(german.split(" | "), english.split(" | ")):
                de = annotation.sub("", de).split(";")[0].strip()
                en = annotation.sub("", en).split(";")[0].strip()
                if len(de.split()) >= 3 and len(en.split()) >= 3 and de[-1:] in ".?!" and en[-1:] in ".?!":
                    yield en, de


_BLOCKS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "td", "th", "dt")


def html_blocks(path: Path, by_id: bool):
    """Text of block elements: {id: text} when ``by_id``, else the list in document order."""
    from lxml import html

    try:
        root = html.parse(str(path)).getroot()
    except (OSError, ValueError):
        return None
    if root is None:
        return None
    blocks = [el for el in root.iter() if isinstance(el.tag, str) and el.tag in _BLOCKS]
    if by_id:
        return {el.get("id"): normalise(el.text_content()) for el in blocks if el.get("id")}
    return [normalise(el.text_content()) for el in blocks]


def html_pairs(en_root: Path, de_root: Path, by_id: bool) -> Iterator[Pair]:
    if not en_root.is_dir() or not de_root.is_dir():
        return
    for en_page in sorted(en_root.rglob("*.html")):
        de_page = de_root / en_page.relative_to(en_root)
        if not de_page.is_file():
            continue
        en, de = html_blocks(en_page, by_id), html_blocks(de_page, by_id)
        if not en or not de:
            continue
        if by_id:
            yield from ((en[k], de[k]) for k in en if k in de)
        elif len(en) == len(de):
            yield from zip(en, de)


_ROFF_BREAK = re.compile(r"^[.'](PP|P|LP|TP|IP|HP|TQ|SH|SS|sp|br|RS|RE|nf|fi|EX|EE|TH)\b")


def roff_paragraphs(path: Path) -> Optional[List[str]]:
    try:
        text = gzip.open(path, "rt", encoding="utf-8", errors="replace").read()
    except OSError:
        return None
    if text.startswith(".so "):
        return None  # a link to another page
    paragraphs: List[str] = []
    current: List[str] = []
    for line in text.splitlines() + [".PP"]:
        if line.startswith(('.\\"', '\\"')):
            continue
        if _ROFF_BREAK.match(line):
            if current:
                para = " ".join(current)
                para = re.sub(r"\\f(\[[^\]]*\]|\(..|.)", "", para)
                para = re.sub(r"\\(\(..|\[[^\]]*\])", " ", para).replace("\\-", "-").replace("\\&", "")
                para = normalise(para.replace("\\ ", " "))
                if para:
                    paragraphs.append(para)
            current = []
            heading = line.split(None, 1)
            if line[1:3] in ("SH", "SS") and len(heading) > 1:
                paragraphs.append(normalise(heading[1].replace('"', "")))
            continue
        macro = re.match(r"^[.'](B|I|BR|BI|IB|RB|RI|IR|SM|SB)\s+(.*)$", line)
        if macro:
            current.append(macro.group(2).replace('"', ""))
        elif not line.startswith((".", "'")):
            current.append(line)
    return paragraphs


def manpage_pairs(root: Path) -> Iterator[Pair]:
    german = root / "manpages-de" / "usr" / "share" / "man" / "de"
    english = [root / p / "usr" / "share" / "man" for p in ("manpages", "manpages-dev")]
    if not german.is_dir():
        return
    for page in sorted(german.rglob("*.gz")):
        rel = page.relative_to(german)
        en_page = next((r / rel for r in english if (r / rel).is_file()), None)
        if en_page is None:
            continue
        en, de = roff_paragraphs(en_page), roff_paragraphs(page)
        if en and de and len(en) == len(de):
            yield from zip(en, de)


def sources(root: Path) -> Dict[str, Callable[[], Iterable[Pair]]]:
    return {
        "libreoffice-help": lambda: html_pairs(
            root / "libreoffice-help-en-us/usr/share/libreoffice/help/en-US",
            root / "libreoffice-help-de/usr/share/libreoffice/help/de", by_id=True),
        "ding": lambda: ding_pairs(root / "trans-de-en/usr/share/trans/de-en")
        if (root / "trans-de-en/usr/share/trans/de-en").is_file() else iter(()),
        "manpages": lambda: manpage_pairs(root),
        "gimp-help": lambda: html_pairs(root / "gimp-help-en/usr/share/gimp/2.0/help/en",
                                        root / "gimp-help-de/usr/share/gimp/2.0/help/de", by_id=False),
        "debian-handbook": lambda: html_pairs(
            root / "debian-handbook/usr/share/doc/debian-handbook/html/en-US",
            root / "debian-handbook/usr/share/doc/debian-handbook/html/de-DE", by_id=False),
        "gettext-mo": lambda: catalogue_pairs(root),
    }


def acceptable(en: str, de: str) -> bool:
    if not en or not de or en.lower() == de.lower():
        return False
    if len(en.split()) > 200 or len(de.split()) > 200:
        return False
    return 0.4 <= len(en) / len(de) <= 2.5


def leak_key(text: str) -> str:
    return re.sub(r"[\W\d_]+", " ", text.lower()).strip()


def split_pairs(pairs: List[Tuple[str, str, str]]) -> Dict[str, List[Tuple[str, str, str]]]:
    """~1% valid and ~1% test by hash of the normalised English side; no held-out side in train."""
    splits: Dict[str, List[Tuple[str, str, str]]] = {"train": [], "valid": [], "test": []}
    for origin, en, de in pairs:
        bucket = int(hashlib.md5(leak_key(en).encode()).hexdigest(), 16) % 100
        eligible = len(en.split()) >= 4
        split = "valid" if eligible and bucket == 0 else "test" if eligible and bucket == 1 else "train"
        splits[split].append((origin, en, de))
    held = {leak_key(side) for s in ("valid", "test") for _, en, de in splits[s] for side in (en, de)}
    splits["train"] = [p for p in splits["train"] if leak_key(p[1]) not in held and leak_key(p[2]) not in held]
    return splits


def build(root: Path, out: Path) -> Counter:
    seen, pairs, stats = set(), [], Counter()
    for origin, generate in sources(root).items():
        for en, de in generate():
            en, de = normalise(en), normalise(de)
            stats[f"{origin} seen"] += 1
            if acceptable(en, de) and en not in seen:
                seen.add(en)
                pairs.append((origin, en, de))
                stats[f"{origin} kept"] += 1
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in split_pairs(pairs).items():
        for index, field in ((1, "en"), (2, "de"), (0, "origin")):
            (out / f"{split}.{field}").write_text("".join(row[index] + "\n" for row in rows), encoding="utf-8")
        stats[split] = len(rows)
    return stats


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.splitlines()[2].strip())
    for key, value in sorted(build(Path(sys.argv[1]), Path(sys.argv[2])).items()):
        print(f"{key:28s} {value:8d}")
