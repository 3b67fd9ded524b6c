"""``capsagg-translate``: line-by-line translation that survives any input line.

Every input line gives exactly one output line (plain detokenised text, in
input order), and each line that needed repair gets one message on standard
error; the repairs are those of :meth:`fairseq_capsagg.tools.hub.CapsAggHubInterface.translate_lines`:

* invalid UTF-8 bytes are replaced by U+FFFD; control characters are removed;
* empty and whitespace-only lines give an empty translation;
* lines longer than the model's ``--max-source-positions`` are truncated;
* a line whose translation fails gives an empty line and the reason.

    capsagg-translate --model-dir runs/main/checkpoints/emrouting --checkpoint checkpoint_last.pt \\
        --data runs/main/data-bin --sentencepiece-model runs/main/spm/spm.model < input.en
"""

import argparse
import sys
from typing import BinaryIO, List, Optional, TextIO

from ..input_repair import read_batches


def translate_stream(hub, source: BinaryIO, target: TextIO, errors: TextIO, beam: int, batch_size: int = 16) -> None:
    """Translates ``source`` line by line, one output line and at most one message per line."""
    number = 0
    for batch in read_batches(source, batch_size):
        for output, notes in hub.translate_lines(batch, beam=beam):
            number += 1
            if notes:
                errors.write(f"capsagg-translate: line {number}: {'; '.join(notes)}\n")
            target.write(output + "\n")
        target.flush()


def build_parser() -> argparse.ArgumentParser:
    """``capsagg-translate``'s flags, each with its help text."""
    parser = argparse.ArgumentParser(prog="capsagg-translate", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the directory that holds the checkpoint")
    parser.add_argument("--checkpoint", default="checkpoint_best.pt",
                        help="the checkpoint's file name in --model-dir (default checkpoint_best.pt)")
    parser.add_argument("--data", required=True, help="the data-bin directory with the dictionaries")
    subwords = parser.add_mutually_exclusive_group(required=True)
    subwords.add_argument("--sentencepiece-model",
                          help="the model's sentencepiece model (fairseq's --bpe sentencepiece)")
    subwords.add_argument("--bpe-codes", help="the model's subword-nmt codes (fairseq's --bpe subword_nmt)")
    parser.add_argument("--beam", type=int, default=4, help="beam size (default 4)")
    parser.add_argument("--input", default="-", help="input file (default: standard input)")
    return parser


def cli_main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.beam < 1:
        parser.error(f"--beam: got {args.beam}; it must be an integer >= 1")

    from .hub import from_pretrained

    try:
        bpe = ({"bpe": "sentencepiece", "sentencepiece_model": args.sentencepiece_model} if args.sentencepiece_model
               else {"bpe": "subword_nmt", "bpe_codes": args.bpe_codes})
        hub = from_pretrained(args.model_dir, args.checkpoint, data_name_or_path=args.data, **bpe)
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
