"""Reading and repairing raw input lines before translation.

One place decides what a translation entry point does with a line a model
cannot read as it is (``capsagg-translate``, the hub helper and the guard for
``fairseq-interactive`` all use it):

* bytes that are not UTF-8 are replaced by U+FFFD (and so are lone
  surrogates, which Python makes of such bytes under ``surrogateescape``);
* control characters other than tab are removed;
* runs of whitespace become one space, and the ends are stripped; for
  ``fairseq-interactive`` (``keep_fields``) only the ends of the line are stripped, as
  fairseq itself does, so that a whitespace-sensitive ``--bpe`` (``characters``, ``bytes``)
  reads what it reads without the plugin, and the tab-separated fields of ``--constraints``
  are kept, empty ones dropped;
* a source longer than the model's positions keeps its first tokens and EOS.

Each repair is reported as a short note, so that the caller can give one
message for the line.
"""

import unicodedata
from typing import BinaryIO, Iterator, List, Tuple, Union

import torch
from torch import Tensor

INVALID_UTF8 = "invalid UTF-8 bytes replaced by U+FFFD"
CONTROL_CHARACTERS = "control characters removed"
EMPTY = "empty input, nothing to translate"
EMPTY_FIELDS = "empty tab-separated fields removed"


def decode_line(raw: Union[bytes, str]) -> Tuple[str, List[str]]:
    """Decodes one line to text that every encoder can take; returns (text, notes)."""
    if isinstance(raw, bytes):
        text = raw.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd") > raw.count(b"\xef\xbf\xbd")
    else:
        text = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in raw)
        replaced = text != raw
    return text.rstrip("\r\n"), [INVALID_UTF8] if replaced else []


def repair_line(raw: Union[bytes, str], keep_fields: bool = False) -> Tuple[str, List[str]]:
    """:func:`decode_line`, then control characters removed and whitespace collapsed.

    With ``keep_fields`` the line is what ``fairseq-interactive`` reads: a source and,
    tab-separated, its constraints (``--constraints``). Only the line's ends are stripped
    (fairseq's own ``strip()``; whitespace inside is left to the tokenizer and ``--bpe``), the
    tabs are kept, and empty fields after the source are dropped (an empty constraint would
    stop the search).
    """
    text, notes = decode_line(raw)
    cleaned = "".join(ch for ch in text if ch == "\t" or unicodedata.category(ch) != "Cc")
    if cleaned != text:
        notes.append(CONTROL_CHARACTERS)
    if not keep_fields:
        return " ".join(cleaned.split()), notes
    source, *fields = cleaned.strip().split("\t")
    kept = [field for field in fields if field.strip()]
    if len(kept) < len(fields) and (source.strip() or kept):
        notes.append(EMPTY_FIELDS)
    return "\t".join([source, *kept]), notes


def truncate_tokens(tokens: Tensor, limit: int) -> Tuple[Tensor, List[str]]:
    """Cuts a source ending in EOS to ``limit`` tokens, EOS kept; returns (tokens, notes)."""
    if len(tokens) <= limit:
        return tokens, []
    note = f"{len(tokens) - 1} subword tokens, truncated to {limit - 1}"
    return torch.cat([tokens[: limit - 1], tokens[-1:]]), [note]


def read_batches(source: BinaryIO, size: int) -> Iterator[List[bytes]]:
    """The raw lines of ``source`` in lists of ``size`` (the last may be shorter)."""
    batch: List[bytes] = []
    for raw in source:
        batch.append(raw)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
