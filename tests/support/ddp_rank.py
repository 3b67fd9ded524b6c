"""Runs fairseq-train as one hand-launched rank and records a parameter hash after each update.

Usage: python ddp_rank.py HASHES.json FAIRSEQ-TRAIN-ARGS...
"""

import hashlib
import json
import sys

from fairseq import trainer as trainer_module

_train_step = trainer_module.Trainer.train_step
hashes = []


def train_step_and_hash(self, samples, raise_oom=False):
    output = _train_step(self, samples, raise_oom)
    digest = hashlib.sha256()
    for name, param in sorted(self.model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().numpy().tobytes())
    hashes.append(digest.hexdigest())
    return output


trainer_module.Trainer.train_step = train_step_and_hash

if __name__ == "__main__":
    from fairseq_cli.train import cli_main

    out_path = sys.argv.pop(1)
    sys.argv[0] = "fairseq-train"
    try:
        cli_main()
    finally:
        with open(out_path, "w") as f:
            json.dump(hashes, f)
