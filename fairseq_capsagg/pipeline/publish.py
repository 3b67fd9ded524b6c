"""A table written to its work directory and published to ``--publish DIR``, never over results it lacks.

A work directory lost with its machine starts again with every row pending; its first table must not
replace the published one that holds the lost rows' results.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Sequence


def unscored_here(published: Path, payload: Dict[str, object]) -> List[str]:
    """The rows that the table published at ``published`` scored and that ``payload`` lists without a result:
    what publishing ``payload`` over it would lose (a work directory lost with its machine, or replaced)."""
    if not published.is_file():
        return []
    scored = json.loads(published.read_text()).get("results", {})
    return [row["name"] for row in payload["rows"] if row["name"] in scored and row["name"] not in payload["results"]]


def write_outputs(args: argparse.Namespace, stem: str, table: str, payload: Dict[str, object],
                  figures: Sequence[Path] = ()) -> None:
    """The table as ``args.workdir``/{stem}.md and .json; with ``args.publish`` (``--publish DIR``) also
    DIR/{stem}-{cpu,gpu}.{md,json} (``args.gpu``) and the figures (a GPU figure gains the ``-gpu`` suffix),
    unless the table published there has scored rows that this one lists as not scored: then it stays as it
    is, and a line on stderr says why."""
    device = "gpu" if args.gpu else "cpu"
    (args.workdir / f"{stem}.md").write_text(table)
    (args.workdir / f"{stem}.json").write_text(json.dumps(payload, indent=2))
    print(table)
    if args.publish is None:
        return
    published = args.publish / f"{stem}-{device}.json"
    lost = unscored_here(published, payload)
    if lost:
        print(f"table1: not published to {args.publish}: {published.name} there has results of {', '.join(lost)}, "
              f"which {args.workdir} has not scored (a work directory lost with its machine, or replaced); the "
              f"table is in {args.workdir / (stem + '.md')}; publish it elsewhere (--publish DIR) or move "
              f"{published} away first", file=sys.stderr, flush=True)
        return
    args.publish.mkdir(parents=True, exist_ok=True)
    for ext in ("md", "json"):
        shutil.copy2(args.workdir / f"{stem}.{ext}", args.publish / f"{stem}-{device}.{ext}")
    for figure in figures:
        name = figure.name if device == "cpu" else f"{figure.stem}-gpu{figure.suffix}"
        shutil.copy2(figure, args.publish / name)
