"""The plugin's model flags as a Markdown table, read from the parser fairseq builds.

The README's flags table is this output (tested to match): ``python -m fairseq_capsagg.tools.flags``
prints it, ``--write README.md`` replaces the table between its ``<!-- flags:begin/end -->`` markers.
"""

import argparse
from pathlib import Path
from typing import List, Optional

from fairseq.models.transformer import TransformerModel

from ..models import CapsAggTransformerModel
from ..models.capsagg_transformer import capsagg_base_architecture
from .markdown_block import write_block


def plugin_actions() -> List[argparse.Action]:
    """The flags ``capsagg_transformer`` adds to fairseq's Transformer, in the order it adds them."""
    ours, theirs = argparse.ArgumentParser(), argparse.ArgumentParser()
    CapsAggTransformerModel.add_args(ours)
    TransformerModel.add_args(theirs)
    taken = {option for action in theirs._actions for option in action.option_strings}
    return [a for a in ours._actions if a.option_strings and not set(a.option_strings) & taken]


def _values(action: argparse.Action) -> str:
    if action.choices:
        return ", ".join(f"`{c}`" for c in action.choices)
    if action.nargs == 0:
        return "switch"
    return f"`{action.metavar or action.dest.upper()}`"


def flags_table() -> str:
    """| flag | values | default | meaning |, one row per flag; defaults as the architectures fill them."""
    defaults = argparse.Namespace()
    capsagg_base_architecture(defaults)
    rows = ["| flag | values | default | meaning |", "|---|---|---|---|"]
    for action in plugin_actions():
        default = getattr(defaults, action.dest, None)
        shown = "off" if default is False else "on" if default is True else "–" if default is None else f"`{default}`"
        meaning = " ".join((action.help or "").split()).removesuffix(f" (default: {default})").replace("|", "\\|")
        rows.append(f"| `{action.option_strings[0]}` | {_values(action)} | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"


def cli_main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="flags", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, default=None, help="replace the flags table of this Markdown file")
    args = parser.parse_args(argv)
    if args.write:
        write_block(args.write, "flags", flags_table())
    else:
        print(flags_table(), end="")


if __name__ == "__main__":
    cli_main()
