"""Validation loss of aggregation models warm-started from a vanilla Transformer, at step 0.

    python -m fairseq_capsagg.tools.warm_start_loss --path BASELINE.pt --data DATA-BIN \\
        --arch transformer_dyncomb_small transformer_emrouting_small \\
        --model-args="--routing-init identity"

builds each architecture with the baseline's shape, loads the baseline checkpoint the
way ``--finetune-from-model`` does (shared weights from the checkpoint, aggregators freshly
initialised, with the ``--model-args`` flags) and reports fairseq's validation loss (base 2,
per target token) next to the baseline's own, over the sentences fairseq's validation reads: with the
checkpoint's ``--required-batch-size-multiple`` (8 by default) fairseq leaves out the last batch of the
length-ordered split when it is smaller than that (fairseq issue #5036), so the baseline's loss here is
the one ``fairseq-train`` logged for it.
"""

import argparse
import copy
import json
import math
import sys
from typing import Dict, Mapping, Sequence, Set, Tuple

import torch
from fairseq import checkpoint_utils, utils
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel

from ..user_dir import USER_DIR
from ..models import CapsAggTransformerModel
from .arguments import check_checkpoint, check_data_bin


def model_flag_parser(model) -> argparse.ArgumentParser:
    """The model's own flags, each absent from a parse unless given."""
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS, add_help=False)
    model.add_args(parser)
    return parser


def aggregation_arg_names() -> Set[str]:
    """The flags the plugin adds to fairseq's Transformer (an architecture fills them in, so they are
    removed from the baseline's arguments first)."""
    def dests(model) -> Set[str]:
        return {action.dest for action in model_flag_parser(model)._actions}

    return dests(CapsAggTransformerModel) - dests(TransformerModel)


@torch.no_grad()
def validation_loss(model, task, criterion, subset: str, max_tokens: int,
                    required_batch_size_multiple: int) -> Dict[str, float]:
    """fairseq's validation loss of ``model`` on ``subset`` (bits per target token), batched as fairseq
    batches it (``required_batch_size_multiple`` decides which sentences a validation leaves out)."""
    model.eval()
    iterator = task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=max_tokens,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=True, required_batch_size_multiple=required_batch_size_multiple,
    ).next_epoch_itr(shuffle=False)
    loss = nll = tokens = 0.0
    for sample in iterator:
        _, _, log = task.valid_step(sample, model, criterion)
        loss, nll, tokens = loss + float(log["loss"]), nll + float(log["nll_loss"]), tokens + log["ntokens"]
    return {"loss": loss / tokens / math.log(2), "nll_loss": nll / tokens / math.log(2)}


def warm_start_losses(path: str, data: str, starts: Mapping[str, Tuple[str, Sequence[str]]], subset: str = "valid",
                      max_tokens: int = 8000) -> Dict[str, Dict[str, float]]:
    """Validation loss and nll loss (bits) on ``subset`` of the checkpoint at ``path`` (``baseline``) and of every
    warm start of ``starts`` (name: architecture and its model flags) from it before any update; the checkpoint,
    its task and ``subset`` are loaded once for all."""
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [path], arg_overrides={"data": data, "user_dir": USER_DIR})
    state = checkpoint_utils.load_checkpoint_to_cpu(path)["model"]
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset(subset)
    multiple = cfg.dataset.required_batch_size_multiple
    results = {"baseline": validation_loss(models[0], task, criterion, subset, max_tokens, multiple)}
    ours, flags = aggregation_arg_names(), model_flag_parser(CapsAggTransformerModel)
    for name, (arch, model_args) in starts.items():
        args = copy.deepcopy(cfg.model)
        for flag in ours:
            if hasattr(args, flag):
                delattr(args, flag)
        vars(args).update(vars(flags.parse_args(list(model_args))))
        args.arch = arch
        ARCH_CONFIG_REGISTRY[arch](args)
        torch.manual_seed(cfg.common.seed)
        model = CapsAggTransformerModel.build_model(args, task)
        model.load_state_dict(dict(state), strict=True)
        results[name] = validation_loss(model, task, criterion, subset, max_tokens, multiple)
    return results


def cli_main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, help="a vanilla Transformer checkpoint")
    parser.add_argument("--data", required=True)
    parser.add_argument("--arch", nargs="+", required=True)
    parser.add_argument("--subset", default="valid")
    parser.add_argument("--model-args", default="",
                        help="model flags of every architecture, e.g. --model-args=\"--routing-init identity\"")
    args = parser.parse_args(argv)
    check_checkpoint(parser, args.path)
    check_data_bin(parser, args.data)
    ours = sorted(name for name, model in ARCH_MODEL_REGISTRY.items() if model is CapsAggTransformerModel)
    unknown = [arch for arch in args.arch if arch not in ours]
    if unknown:
        parser.error(f"--arch: unknown {', '.join(unknown)}; choose from {', '.join(ours)}")
    starts = {arch: (arch, args.model_args.split()) for arch in args.arch}
    print(json.dumps(warm_start_losses(args.path, args.data, starts, args.subset), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
