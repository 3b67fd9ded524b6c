"""Makes fairseq's checkpoint copies atomic, so a killed run never leaves a truncated checkpoint.

fairseq writes the first checkpoint of a save atomically (to ``NAME.tmp``,
then a rename), but makes ``checkpoint_last.pt`` and ``checkpoint_best.pt`` by
copying that file in place with ``PathManager.copy``. A run killed during the
copy leaves a truncated ``checkpoint_last.pt``, and the restarted run fails
to load it. The copy is replaced by copy-to-temporary-then-rename for local
files; other storage backends keep fairseq's behaviour.
"""

import os
import shutil

from fairseq.file_io import PathManager

_fairseq_copy = PathManager.copy


def atomic_copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
    """Copies ``src_path`` to ``dst_path`` so that ``dst_path`` is always whole."""
    if PathManager.path_requires_pathmanager(src_path) or PathManager.path_requires_pathmanager(dst_path):
        return _fairseq_copy(src_path, dst_path, overwrite=overwrite)
    # like fairseq's local copy (shutil.copyfile), an existing destination is replaced
    tmp_path = f"{dst_path}.tmp"
    shutil.copyfile(src_path, tmp_path)
    with open(tmp_path, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp_path, dst_path)
    return True


def install_atomic_checkpoint_copies() -> None:
    """Routes fairseq's ``PathManager.copy`` through :func:`atomic_copy` (idempotent)."""
    if PathManager.copy is not atomic_copy:
        PathManager.copy = staticmethod(atomic_copy)
