"""Repairing raw input lines before translation.

One place decides what a translation entry point does with a line a model
cannot read as it is (``capsagg-translate``, the hub helper and the guard for
``fairseq-interactive`` all use it):

* bytes that are not UTF-8 are replaced by U+FFFD (and so are lone
  surrogates, which Python makes of such bytes under ``surrogateescape``);
* control characters other than tab are removed;
* runs of whitespace become one space, and the ends are stripped.

Each repair is reported as a short note, so that the caller can give one
message for the line.
"""

import unicodedata
from typing import List, Tuple, Union

INVALID_UTF8 = "invalid UTF-8 bytes replaced by U+FFFD"
CONTROL_CHARACTERS = "control characters removed"
EMPTY = "empty input, nothing to translate"


def decode_line(raw: Union[bytes, str]) -> Tuple[str, List[str]]:
    """Decodes one line to text that every encoder can take; returns (text, notes)."""
    if isinstance(raw, bytes):
        text = raw.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd") > raw.count(b"\xef\xbf\xbd")
    else:
        text = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in raw)
        replaced = text != raw
    return text.rstrip("\r\n"), [INVALID_UTF8] if replaced else []


def repair_line(raw: Union[bytes, str]) -> Tuple[str, List[str]]:
    """:func:`decode_line`, then control characters removed and whitespace collapsed."""
    text, notes = decode_line(raw)
    cleaned = "".join(ch for ch in text if ch == "\t" or unicodedata.category(ch) != "Cc")
    if cleaned != text:
        notes.append(CONTROL_CHARACTERS)
    return " ".join(cleaned.split()), notes


def truncation_note(num_tokens: int, limit: int) -> str:
    return f"{num_tokens} subword tokens, truncated to {limit}"
