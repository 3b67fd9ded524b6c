"""What every translation entry point does with a raw input line (fairseq_capsagg.input_repair)."""

import pytest

from fairseq_capsagg.input_repair import CONTROL_CHARACTERS, EMPTY_FIELDS, INVALID_UTF8, decode_line, repair_line


@pytest.mark.parametrize("raw, text, notes", [
    (b"Open the file.\n", "Open the file.", []),
    ("Öffnen Sie die Datei.", "Öffnen Sie die Datei.", []),
    (b"\xff\xfe Save", "\ufffd\ufffd Save", [INVALID_UTF8]),
    ("Save \udcff it", "Save \ufffd it", [INVALID_UTF8]),  # a byte Python kept under surrogateescape
    ("keeps a real \ufffd", "keeps a real \ufffd", []),  # U+FFFD that was in the input is not a repair
    (b"keeps a real \xef\xbf\xbd", "keeps a real \ufffd", []),
    (b"Open\x01 the\x07 file\r\n", "Open the file", [CONTROL_CHARACTERS]),
    (b"  a \t  b  ", "a b", []),
    (b"", "", []),
    (b"\x00\x1b", "", [CONTROL_CHARACTERS]),
    (b"\x80\x01", "\ufffd", [INVALID_UTF8, CONTROL_CHARACTERS]),
])
def test_repair_line(raw, text, notes):
    assert repair_line(raw) == (text, notes)


@pytest.mark.parametrize("raw, text, notes", [
    (b"Open the file.\tDatei\n", "Open the file.\tDatei", []),
    # only the line's ends are stripped, as fairseq-interactive does (whitespace-sensitive --bpe)
    (b"  Open  the file \t  neue  Datei \tFenster ", "Open  the file \t  neue  Datei \tFenster", []),
    (b"Open\x01 it\tDa\x07tei", "Open it\tDatei", [CONTROL_CHARACTERS]),
    (b"Open it\t\t \tDatei\t", "Open it\tDatei", [EMPTY_FIELDS]),
    (b" \t \t", "", []),
])
def test_repair_keeps_tab_separated_fields(raw, text, notes):
    """fairseq-interactive --constraints reads constraints from tab-separated fields."""
    assert repair_line(raw, keep_fields=True) == (text, notes)


def test_decode_keeps_what_it_does_not_need_to_repair():
    assert decode_line(b"a\tb\x01\n") == ("a\tb\x01", [])
