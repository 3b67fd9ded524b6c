"""fairseq-train whose N-th checkpoint write or copy stalls half-way, so a test can kill it there.

Environment: STALL_PHASE (save or copy), STALL_AT (1-based call number), STALL_MARKER (a file
created when the stall begins). Usage: python stalled_io_train.py FAIRSEQ-TRAIN-ARGS...
"""

import os
import shutil
import sys
import time

import torch

PHASE, AT, MARKER = os.environ["STALL_PHASE"], int(os.environ["STALL_AT"]), os.environ["STALL_MARKER"]
calls = {"save": 0, "copy": 0}


def stall():
    open(MARKER, "w").close()
    time.sleep(600)


_save, _copyfile = torch.save, shutil.copyfile


def save(obj, f, *args, **kwargs):
    calls["save"] += 1
    if PHASE == "save" and calls["save"] == AT:
        _save(obj, f, *args, **kwargs)
        f.flush()  # the bytes are on disk under NAME.tmp; the rename has not happened
        stall()
    return _save(obj, f, *args, **kwargs)


def copyfile(src, dst, *args, **kwargs):
    calls["copy"] += 1
    if PHASE == "copy" and calls["copy"] == AT:
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            fout.write(fin.read(os.path.getsize(src) // 2))  # half the destination is written
        stall()
    return _copyfile(src, dst, *args, **kwargs)


torch.save = save
shutil.copyfile = copyfile

if __name__ == "__main__":
    from fairseq_cli.train import cli_main

    sys.argv[0] = "fairseq-train"
    cli_main()
