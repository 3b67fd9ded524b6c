"""Generated blocks of a Markdown page: the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``."""

import argparse
import re
from pathlib import Path
from typing import Callable, List, Optional


def find_block(text: str, name: str) -> Optional[re.Match]:
    """The block ``name`` of ``text``: groups 1 and 3 its markers, group 2 its content; None without one."""
    pattern = rf"(<!-- {re.escape(name)}:begin -->\n)(.*?)(<!-- {re.escape(name)}:end -->)"
    return re.search(pattern, text, flags=re.S)


def _page_block(path: Path, name: str):
    """``path``'s text and its block ``name``; SystemExit naming the file or the markers it lacks."""
    if not path.is_file():
        raise SystemExit(f"{name}: error: {path}: no such file")
    text = path.read_text(encoding="utf-8")
    match = find_block(text, name)
    if match is None:
        raise SystemExit(f"{name}: error: {path} has no <!-- {name}:begin --> ... <!-- {name}:end --> block")
    return text, match


def read_block(path: Path, name: str) -> str:
    """The text of block ``name`` in ``path``."""
    return _page_block(path, name)[1].group(2)


def write_block(path: Path, name: str, content: str) -> None:
    """Replaces the text of block ``name`` in ``path`` with ``content`` (which ends with a newline)."""
    text, match = _page_block(path, name)
    path.write_text(text[:match.start(2)] + content + text[match.end(2):], encoding="utf-8")


def block_cli(name: str, description: str, table: Callable[[Path], str], results: Path,
              argv: Optional[List[str]] = None) -> None:
    """The command of a table generated from the published results: prints ``table(results)``, or with
    ``--write PAGE`` replaces block ``name`` of PAGE with it."""
    parser = argparse.ArgumentParser(prog=name.replace("-", "_"), description=description)
    parser.add_argument("--results", type=Path, default=results, help="the published tables' folder")
    parser.add_argument("--write", type=Path, default=None, help=f"replace the {name} table of this Markdown file")
    args = parser.parse_args(argv)
    text = table(args.results)
    if args.write:
        write_block(args.write, name, text)
    else:
        print(text, end="")
