"""Validation loss of aggregation models warm-started from a vanilla Transformer, at step 0.

    python -m fairseq_capsagg.warm_start_loss --path BASELINE.pt --data DATA-BIN \\
        --arch transformer_dyncomb_small transformer_emrouting_small

builds each architecture with the baseline's shape, loads the baseline checkpoint the
way ``--finetune-from-model`` does (shared weights from the checkpoint, aggregators freshly
initialised) and reports fairseq's validation loss (base 2, per target token) next to the
baseline's own.
"""

import argparse
import copy
import json
import math
import sys
from typing import Dict, List

import torch
from fairseq import checkpoint_utils, utils
from fairseq.models import ARCH_CONFIG_REGISTRY

from . import USER_DIR
from .models import CapsAggTransformerModel

#: Flags an architecture fills in; removed from the baseline's arguments before it does.
AGGREGATION_ARGS = ("encoder_aggregation", "decoder_aggregation", "aggregate_embedding", "output_capsules",
                    "routing_iters", "capsule_input", "aggregation_ffn_dim", "linear_combination_weights",
                    "em_inverse_temperature", "capsule_rank")


@torch.no_grad()
def validation_loss(model, task, criterion, subset: str, max_tokens: int) -> Dict[str, float]:
    model.eval()
    iterator = task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True).next_epoch_itr(shuffle=False)
    loss = nll = tokens = 0.0
    for sample in iterator:
        _, _, log = task.valid_step(sample, model, criterion)
        loss, nll, tokens = loss + float(log["loss"]), nll + float(log["nll_loss"]), tokens + log["ntokens"]
    return {"loss": loss / tokens / math.log(2), "nll_loss": nll / tokens / math.log(2)}


def warm_start_losses(path: str, data: str, archs: List[str], subset: str = "valid",
                      max_tokens: int = 8000) -> Dict[str, Dict[str, float]]:
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data, "user_dir": USER_DIR})
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset(subset)
    results = {"baseline": validation_loss(models[0], task, criterion, subset, max_tokens)}
    for arch in archs:
        args = copy.deepcopy(cfg.model)
        for name in AGGREGATION_ARGS:
            if hasattr(args, name):
                delattr(args, name)
        args.arch = arch
        ARCH_CONFIG_REGISTRY[arch](args)
        torch.manual_seed(cfg.common.seed)
        model = CapsAggTransformerModel.build_model(args, task)
        model.load_state_dict(dict(state), strict=True)
        results[arch] = validation_loss(model, task, criterion, subset, max_tokens)
    return results


def cli_main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, help="a vanilla Transformer checkpoint")
    parser.add_argument("--data", required=True)
    parser.add_argument("--arch", nargs="+", required=True)
    parser.add_argument("--subset", default="valid")
    args = parser.parse_args(argv)
    print(json.dumps(warm_start_losses(args.path, args.data, args.arch, args.subset), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
