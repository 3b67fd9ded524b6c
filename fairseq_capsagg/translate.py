"""``capsagg-translate``: line-by-line translation that survives any input line.

Unlike ``fairseq-interactive``, which stops at the first invalid UTF-8 byte,
every input line gives exactly one output line, and each line that needed
repair gets one message on standard error:

* invalid UTF-8 bytes are replaced by U+FFFD; control characters are removed;
* empty and whitespace-only lines give an empty translation;
* lines longer than the model's ``--max-source-positions`` are truncated;
* a line whose translation fails gives an empty line and the reason.

    capsagg-translate --model-dir runs/main/checkpoints/emrouting --checkpoint checkpoint_last.pt \\
        --data runs/main/data-bin --sentencepiece-model runs/main/spm/spm.model < input.en
"""

import argparse
import sys
import unicodedata
from typing import BinaryIO, List, Optional, TextIO, Tuple


def sanitise(raw: bytes) -> Tuple[str, List[str]]:
    """Decodes one input line and removes what a model cannot read; returns (text, notes)."""
    notes = []
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in raw:
        notes.append("invalid UTF-8 bytes replaced by U+FFFD")
    cleaned = "".join(ch for ch in text if ch == "\t" or unicodedata.category(ch) != "Cc")
    if cleaned != text:
        notes.append("control characters removed")
    return " ".join(cleaned.split()), notes


def truncate(hub, text: str, max_tokens: int) -> Tuple[str, Optional[str]]:
    """Cuts ``text`` to ``max_tokens`` subword tokens (EOS included) if it is longer."""
    pieces = hub.apply_bpe(hub.tokenize(text)).split()
    if len(pieces) < max_tokens:
        return text, None
    kept = hub.remove_bpe(" ".join(pieces[: max_tokens - 1]))
    return hub.detokenize(kept), f"{len(pieces)} subword tokens, truncated to {max_tokens - 1}"


def translate_stream(hub, source: BinaryIO, target: TextIO, errors: TextIO, beam: int, batch_size: int = 16) -> int:
    """Translates ``source`` line by line; returns how many lines needed a message."""
    max_tokens = min(hub.max_positions[0] if isinstance(hub.max_positions, tuple) else hub.max_positions,
                     hub.models[0].encoder.max_positions())
    flagged = 0
    batch: List[Tuple[int, str]] = []
    outputs = {}

    def flush():
        if not batch:
            return
        try:
            results = hub.translate([text for _, text in batch], beam=beam)
        except Exception:  # one bad line must not lose the others: retry one by one
            results = []
            for number, text in batch:
                try:
                    results.append(hub.translate(text, beam=beam))
                except Exception as e:  # noqa: BLE001 (report any failure of this line)
                    errors.write(f"capsagg-translate: line {number}: not translated: {e}\n")
                    results.append("")
        for (number, _), result in zip(batch, results):
            outputs[number] = result
        batch.clear()

    count = 0
    for count, raw in enumerate(source, 1):
        text, notes = sanitise(raw)
        if not text:
            notes.append("empty input, nothing to translate")
            outputs[count] = ""
        else:
            text, note = truncate(hub, text, max_tokens)
            if note:
                notes.append(note)
            batch.append((count, text))
        if notes:
            flagged += 1
            errors.write(f"capsagg-translate: line {count}: {'; '.join(notes)}\n")
        if len(batch) >= batch_size:
            flush()
    flush()
    for number in range(1, count + 1):
        target.write(outputs.get(number, "") + "\n")
    target.flush()
    return flagged


def cli_main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--checkpoint", default="checkpoint_best.pt")
    parser.add_argument("--data", required=True, help="the data-bin directory with the dictionaries")
    parser.add_argument("--sentencepiece-model", required=True)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--input", default="-", help="input file (default: standard input)")
    args = parser.parse_args(argv)

    from .hub import from_pretrained

    try:
        hub = from_pretrained(args.model_dir, args.checkpoint, data_name_or_path=args.data,
                              bpe="sentencepiece", sentencepiece_model=args.sentencepiece_model)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"capsagg-translate: error: {e}", file=sys.stderr)
        return 2
    source = sys.stdin.buffer if args.input == "-" else open(args.input, "rb")
    try:
        translate_stream(hub, source, sys.stdout, sys.stderr, args.beam)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
