"""Keeps ``fairseq-interactive --user-dir fairseq_capsagg`` translating past bad input lines.

Unguarded, ``fairseq-interactive`` stops the whole run at the first line it
cannot take: bytes that are not UTF-8 reach sentencepiece as lone surrogates
(or fail to decode), and a line longer than the model's source positions makes
the batch iterator raise. When the plugin is loaded by ``fairseq-interactive``
(the tool imports ``--user-dir`` before it reads any input) two of the tool's
own functions are wrapped:

* ``buffered_read`` reads raw bytes and repairs each line with
  :func:`fairseq_capsagg.patches.input_repair.repair_line` (U+FFFD for invalid UTF-8,
  control characters removed, only the line's ends stripped as fairseq strips them,
  the tab-separated fields kept so that
  ``--constraints`` reads the same fields as without the plugin), logging one
  warning for each repaired or empty line;
* ``make_batches`` truncates a line's source tokens to the model's maximum
  source positions (keeping EOS) and logs one warning for it; under
  ``--skip-invalid-size-inputs-valid-test`` fairseq skips such a line itself, as it
  does without the plugin, and the guard only logs that it was skipped.

Every other line is read, batched and printed by fairseq itself, unchanged.
Warnings name the line as fairseq numbers it in its ``S-``/``H-`` output.
"""

import contextlib
import logging
import sys
from types import ModuleType
from typing import BinaryIO, Callable, Iterator, List, Optional

from ..input_repair import read_batches, repair_line, truncate_tokens

logger = logging.getLogger("fairseq_capsagg.interactive")

INTERACTIVE_MODULE = "fairseq_cli.interactive"


class InteractiveGuard:
    """The wrapped ``buffered_read`` and ``make_batches`` of one ``fairseq-interactive`` module."""

    def __init__(self, make_batches: Callable):
        self.fairseq_make_batches = make_batches
        self.first_id = 0  # fairseq's id of the first line of the buffer being translated

    def buffered_read(self, input: str, buffer_size: int) -> Iterator[List[str]]:
        self.first_id = 0
        with self.open_bytes(input) as source:
            for raw_lines in read_batches(source, buffer_size):
                buffer = []
                for line_id, raw in enumerate(raw_lines, self.first_id):
                    text, notes = repair_line(raw, keep_fields=True)  # tabs separate --constraints
                    if not text:
                        notes.append("empty input (fairseq translates it as an empty sentence)")
                    if notes:
                        logger.warning("input line %d (H-%d): %s", line_id + 1, line_id, "; ".join(notes))
                    buffer.append(text)
                yield buffer
                self.first_id += len(buffer)

    @staticmethod
    @contextlib.contextmanager
    def open_bytes(input: str) -> Iterator[BinaryIO]:
        if input == "-":
            yield sys.stdin.buffer
        else:
            with open(input, "rb") as f:
                yield f

    def make_batches(self, lines: List[str], cfg, task, max_positions, encode_fn) -> Iterator:
        limit = max_positions[0] if isinstance(max_positions, tuple) else max_positions
        encode_lines = task.get_interactive_tokens_and_lengths
        skip = cfg.dataset.skip_invalid_size_inputs_valid_test  # fairseq's own answer, kept

        def encode_and_truncate(lines, encode_fn):
            tokens, lengths = encode_lines(lines, encode_fn)
            if limit is None:
                return tokens, lengths
            for i, line_id in enumerate(range(self.first_id, self.first_id + len(tokens))):
                if skip and len(tokens[i]) > limit:
                    logger.warning("input line %d (H-%d): %d subword tokens, longer than %d; skipped "
                                   "(--skip-invalid-size-inputs-valid-test)", line_id + 1, line_id,
                                   len(tokens[i]) - 1, limit - 1)
                    continue
                tokens[i], notes = truncate_tokens(tokens[i], limit)
                if notes:
                    lengths[i] = len(tokens[i])
                    logger.warning("input line %d (H-%d): %s", line_id + 1, line_id, notes[0])
            return tokens, lengths

        task.get_interactive_tokens_and_lengths = encode_and_truncate
        try:
            yield from self.fairseq_make_batches(lines, cfg, task, max_positions, encode_fn)
        finally:
            del task.get_interactive_tokens_and_lengths


def interactive_module() -> Optional[ModuleType]:
    """The running ``fairseq-interactive`` module (console script or ``python -m``), if any."""
    for name in (INTERACTIVE_MODULE, "__main__"):
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.name == INTERACTIVE_MODULE:
            return module
    return None


def install_interactive_guard() -> bool:
    """Wraps the running ``fairseq-interactive``'s input functions (idempotent); False if none runs."""
    module = interactive_module()
    if module is None or isinstance(getattr(module.buffered_read, "__self__", None), InteractiveGuard):
        return False
    guard = InteractiveGuard(module.make_batches)
    module.buffered_read = guard.buffered_read
    module.make_batches = guard.make_batches
    return True
