"""The converged Transformer carried to another machine: the paper's protocol (the continued rows of
``capsagg-table1 --table converged``) run there from the Transformer converged here.

Training the Transformer to convergence takes hours on a CPU and more than a lent GPU's session; its
continued rows take minutes on a GPU. :func:`export` packs what they need from a converged work
directory (about 20 MB at ``small``): the binarised data with its dictionary (xz-compressed), the
subword model and the encoded validation and test splits, the best checkpoint without its optimizer
state, and the Transformer's row as it was scored there (its record, its translations and its
validation logs). ``capsagg-table1 --table converged --reference-from PACK`` imports it
(:func:`import_into`) instead of training ``converged-baseline-s1``; the pack's configuration must
match the run's data settings.

    python -m fairseq_capsagg.pipeline.reference_pack runs/converged .gpu-reference
"""

import argparse
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Dict, Optional, Sequence

from . import convergence, stage_names
from .converged import CONTINUED_REFERENCE, REFERENCE
from .corpus import DEFAULT_PAIR
from .experiment import Stages

#: The data settings a pack and the run importing it must share (the checkpoint's vocabulary and shape).
DATA_KEYS = ("shape", "vocab_size", "max_train_tokens", "quick", "source_lang", "target_lang")
#: The stages of the source work directory that the pack carries (the data, and the Transformer's training).
CARRIED_STAGES = (stage_names.SUBWORDS, stage_names.BINARISE, stage_names.train(REFERENCE))
MANIFEST = "reference.json"


class PackError(RuntimeError):
    """A work directory that cannot be packed, or a pack that this run cannot import."""


def _table_json(work: Path) -> Path:
    """The converged table's JSON that ``capsagg-table1`` wrote into ``work`` (converged.json, or
    converged-zhen.json for another pair)."""
    found = sorted(work.glob("converged*.json"))
    if not found:
        raise PackError(f"{work}: no converged table (converged*.json); run capsagg-table1 --table converged there")
    return found[0]


def export(work: Path, dest: Path) -> Path:
    """Packs ``work``'s converged Transformer into ``dest`` (see the module).

    Raises:
        PackError: ``work`` holds no converged, scored ``converged-baseline-s1``.
    """
    stages = json.loads((work / "stages.json").read_text()) if (work / "stages.json").is_file() else {}
    missing = [name for name in CARRIED_STAGES if name not in stages]
    if missing:
        raise PackError(f"{work}: {', '.join(missing)} not done yet ({REFERENCE} must have converged first)")
    table = json.loads(_table_json(work).read_text())
    result = table["results"].get(REFERENCE)
    if result is None:
        raise PackError(f"{work}: {REFERENCE} is trained but not scored yet; rerun capsagg-table1 --table converged")
    config = json.loads((work / "config.json").read_text())
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "spm").mkdir(parents=True)
    with tarfile.open(dest / "data-bin.tar.xz", "w:xz") as tar:
        tar.add(work / "data-bin", arcname="data-bin")
    for path in (work / "spm").iterdir():
        if not path.name.startswith("train."):  # the encoded training split is in data-bin already
            shutil.copy2(path, dest / "spm" / path.name)
    convergence.copy_without_optimizer(work / "checkpoints" / REFERENCE / "checkpoint_best.pt",
                                       dest / "checkpoint_best.pt")
    shutil.copytree(work / "logs" / f"train-{REFERENCE}", dest / "logs" / f"train-{REFERENCE}")
    (dest / "translations").mkdir()
    for path in (work / "translations").glob(f"{REFERENCE}.*txt"):
        shutil.copy2(path, dest / "translations" / path.name)
    manifest = {"source": str(work.resolve()), "config": config, "stages": {k: stages[k] for k in CARRIED_STAGES},
                "result": result}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return dest


def check_config(pack: Path, config: Dict[str, object]) -> Dict[str, object]:
    """The pack's manifest, once its data settings are those of ``config`` (the importing run's).

    Raises:
        PackError: no pack at ``pack``, or other data settings (each named, with both values).
    """
    if not (pack / MANIFEST).is_file():
        raise PackError(f"--reference-from {pack}: no {MANIFEST} there; make one with "
                        f"`python -m fairseq_capsagg.pipeline.reference_pack WORKDIR {pack}`")
    manifest = json.loads((pack / MANIFEST).read_text())
    source = manifest["config"]
    default_pair = dict(zip(("source_lang", "target_lang"), DEFAULT_PAIR))  # configs of the default pair omit it
    diff = [f"{key}: {source.get(key, default_pair.get(key))} there, {config.get(key, default_pair.get(key))} here"
            for key in DATA_KEYS if source.get(key, default_pair.get(key)) != config.get(key, default_pair.get(key))]
    if diff:
        raise PackError(f"--reference-from {pack}: its Transformer was trained with other data settings "
                        f"({'; '.join(diff)}); rerun with the pack's settings")
    return manifest


def import_into(pack: Path, work: Path, stages: Stages, config: Dict[str, object]) -> Dict[str, object]:
    """Puts the pack's data, subword model, checkpoint, logs and translations where a converged run in
    ``work`` reads them, and records its stages as done (once; a resumed run finds them).

    Returns:
        the manifest: ``source``, the source's ``config`` and the Transformer's scored ``result``.
    """
    manifest = check_config(pack, config)
    if "import reference" in stages.done:
        return manifest
    with tarfile.open(pack / "data-bin.tar.xz") as tar:
        tar.extractall(work, filter="data")
    shutil.copytree(pack / "spm", work / "spm", dirs_exist_ok=True)
    save_dir = work / "checkpoints" / REFERENCE
    save_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(pack / "checkpoint_best.pt", save_dir / "checkpoint_best.pt")
    shutil.copytree(pack / "logs", work / "logs", dirs_exist_ok=True)
    shutil.copytree(pack / "translations", work / "translations", dirs_exist_ok=True)
    for name, record in manifest["stages"].items():
        stages.done[name] = record
    stages.done["import reference"] = {"source": manifest["source"]}
    stages.path.write_text(json.dumps(stages.done, indent=2))
    return manifest


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="reference_pack", description=__doc__.splitlines()[0])
    p.add_argument("workdir", type=Path, help="a converged comparison's work directory (runs/converged)")
    p.add_argument("dest", type=Path, help="the pack's directory (replaced)")
    args = p.parse_args(argv)
    try:
        dest = export(args.workdir, args.dest)
    except PackError as e:
        print(f"reference_pack: error: {e}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
    print(f"{dest}: {REFERENCE} of {args.workdir} ({size / 2**20:.1f} MiB), for "
          f"capsagg-table1 --table converged --reference-from {dest} (its continued rows, {CONTINUED_REFERENCE} first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
