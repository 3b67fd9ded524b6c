"""Generated blocks of a Markdown page: the text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``."""

import re
from pathlib import Path


def _pattern(name: str) -> str:
    return rf"(<!-- {re.escape(name)}:begin -->\n)(.*?)(<!-- {re.escape(name)}:end -->)"


def read_block(path: Path, name: str) -> str:
    """The text of block ``name`` in ``path``; SystemExit naming the file or the markers it lacks."""
    if not path.is_file():
        raise SystemExit(f"{name}: error: {path}: no such file")
    match = re.search(_pattern(name), path.read_text(encoding="utf-8"), flags=re.S)
    if match is None:
        raise SystemExit(f"{name}: error: {path} has no <!-- {name}:begin --> ... <!-- {name}:end --> block")
    return match.group(2)


def write_block(path: Path, name: str, content: str) -> None:
    """Replaces the text of block ``name`` in ``path`` with ``content`` (which ends with a newline)."""
    read_block(path, name)
    text = path.read_text(encoding="utf-8")
    path.write_text(re.sub(_pattern(name), lambda m: m.group(1) + content + m.group(3), text, count=1, flags=re.S),
                    encoding="utf-8")
