"""The corpus rebuild script on a small synthetic unpacked-package tree."""

import gzip
import importlib.util
import struct


from helpers import ROOT

spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "data" / "rebuild" / "build_corpus.py")
build_corpus = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_corpus)


def make_mo(pairs):
    """A GNU .mo catalogue (little-endian) holding a header entry and ``pairs``."""
    entries = [("", "Content-Type: text/plain; charset=UTF-8\n")] + list(pairs)
    ids = [k.encode() for k, _ in entries]
    strs = [v.encode() for _, v in entries]
    n = len(entries)
    ids_at, strs_at = 28, 28 + 8 * n
    data_at = strs_at + 8 * n
    blob, id_table, str_table = b"", b"", b""
    for key in ids:
        id_table += struct.pack("<2I", len(key), data_at + len(blob))
        blob += key + b"\0"
    for value in strs:
        str_table += struct.pack("<2I", len(value), data_at + len(blob))
        blob += value + b"\0"
    return struct.pack("<7I", 0x950412DE, 0, n, ids_at, strs_at, 0, 0) + id_table + str_table + blob


def test_parse_mo_keeps_singular_and_drops_context_and_header():
    data = make_mo([("menu\x04_Open file", "Datei ö_ffnen"), ("One item\x00%d items", "Ein Eintrag\x00%d Einträge")])
    assert build_corpus.parse_mo(data) == [("_Open file", "Datei ö_ffnen"), ("One item", "Ein Eintrag")]
    assert build_corpus.clean_ui_string("<b>_Save</b> as ~PDF &now") == "Save as PDF now"


def test_build_from_synthetic_packages(tmp_path):
    root = tmp_path / "unpacked"
    mo_dir = root / "gimp-data" / "usr" / "share" / "locale" / "de" / "LC_MESSAGES"
    mo_dir.mkdir(parents=True)
    names = ["".join(chr(97 + (i // 26 ** k) % 26) for k in range(3)) for i in range(300)]
    catalogue = [(f"Open the image {n} in a new window", f"Das Bild {n} in einem neuen Fenster öffnen")
                 for n in names] + [("Same", "Same"), ("", "")]
    (mo_dir / "gimp.mo").write_bytes(make_mo(catalogue))
    ding = root / "trans-de-en" / "usr" / "share" / "trans"
    ding.mkdir(parents=True)
    (ding / "de-en").write_text("# comment\nHund {m} | Der Hund bellt laut. :: dog | The dog barks loudly.\n",
                                encoding="utf-8")
    for lang, text in (("en-US", "Choose a colour for the text."), ("de", "Wählen Sie eine Farbe für den Text.")):
        page = root / f"libreoffice-help-{'en-us' if lang == 'en-US' else 'de'}" / "usr/share/libreoffice/help" / lang
        page.mkdir(parents=True)
        (page / "a.html").write_text(f'<html><body><p id="p1">{text}</p><p>ignored</p></body></html>')
    for pkg, lang, text in (("manpages", "", "Print the current working directory name."),
                            ("manpages-de", "de", "Den Namen des aktuellen Arbeitsverzeichnisses ausgeben.")):
        page = root / pkg / "usr/share/man" / lang / "man1"
        page.mkdir(parents=True)
        with gzip.open(page / "pwd.1.gz", "wt") as f:
            f.write(f'.TH PWD 1\n.SH NAME\npwd\n.PP\n{text}\n')
    stats = build_corpus.build(root, tmp_path / "out")
    assert stats["gettext-mo kept"] == 300 and stats["gettext-mo seen"] == 301
    assert stats["ding kept"] == 1 and stats["libreoffice-help kept"] == 1 and stats["manpages kept"] >= 1
    out = tmp_path / "out"
    sizes = {s: len((out / f"{s}.en").read_text().splitlines()) for s in ("train", "valid", "test")}
    assert sizes == {s: len((out / f"{s}.de").read_text().splitlines()) for s in sizes}
    assert sum(sizes.values()) == stats["train"] + stats["valid"] + stats["test"]
    assert stats["valid"] + stats["test"] > 0
    held = {build_corpus.leak_key(x) for s in ("valid", "test") for x in (out / f"{s}.en").read_text().splitlines()}
    assert not held & {build_corpus.leak_key(x) for x in (out / "train.en").read_text().splitlines()}
    assert "The dog barks loudly." in (out / "train.en").read_text() + (out / "test.en").read_text() + \
        (out / "valid.en").read_text()
