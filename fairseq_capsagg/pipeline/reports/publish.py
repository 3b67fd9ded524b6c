"""A table written to its work directory and, with ``--publish DIR``, copied there with its figures."""

import argparse
import json
import shutil
from pathlib import Path
from typing import Dict, Sequence


def published_name(name: str, gpu: bool, device_suffix: bool) -> str:
    """``name`` (``table1.md``) as published: ``table1-cpu.md``/``table1-gpu.md`` with ``device_suffix``, else
    unchanged on a CPU and ``-gpu`` before the extension on a GPU (as the figures are)."""
    stem, dot, ext = name.rpartition(".")
    device = "gpu" if gpu else "cpu"
    if device_suffix:
        return f"{stem}-{device}{dot}{ext}"
    return f"{stem}-gpu{dot}{ext}" if gpu else name


def write_outputs(args: argparse.Namespace, stem: str, table: str, payload: Dict[str, object],
                  figures: Sequence[Path] = (), device_suffix: bool = True) -> None:
    """The table as ``args.workdir``/{stem}.md and .json, printed; with ``args.publish`` (``--publish DIR``) also
    copied to DIR with the figures, under :func:`published_name`."""
    (args.workdir / f"{stem}.md").write_text(table)
    (args.workdir / f"{stem}.json").write_text(json.dumps(payload, indent=2))
    print(table)
    if args.publish is None:
        return
    args.publish.mkdir(parents=True, exist_ok=True)
    for ext in ("md", "json"):
        shutil.copy2(args.workdir / f"{stem}.{ext}", args.publish / published_name(f"{stem}.{ext}", args.gpu,
                                                                                     device_suffix))
    for figure in figures:
        shutil.copy2(figure, args.publish / published_name(figure.name, args.gpu, device_suffix=False))


def published_results(path: Path, config: Dict[str, object]) -> Dict[str, Dict[str, object]]:
    """The rows' results of the table published at ``path`` (none if it is not there), so that a table trained a
    row at a time on several machines keeps the rows this work directory has not scored.

    Raises:
        ValueError: naming ``--publish`` when that table was made with other settings than ``config``.
    """
    if not path.is_file():
        return {}
    payload = json.loads(path.read_text())
    if payload.get("config") != config:
        raise ValueError(f"--publish: {path} holds rows of other settings ({payload.get('config')} against this "
                         f"run's {config}); publish this table elsewhere, or move that one away")
    return payload["results"]
