"""Parameters marked ``no_weight_decay`` get no weight decay.

fairseq builds one parameter group for the whole model, so ``--weight-decay`` decays every weight. The
static weights of the residual streams (hyper-connections, mHC) are mixing coefficients whose values
mean "keep this stream": decayed towards 0 they cut the residual path (the instability the
hyper-connection papers report). This splits each optimizer fairseq builds: marked parameters move
from every group with weight decay into one group of their own with none. A model without marked
parameters, or a run without weight decay, keeps fairseq's single group.
"""

import torch
from fairseq import optim


def exempt_from_weight_decay(optimizer: torch.optim.Optimizer) -> int:
    """Moves the ``no_weight_decay`` parameters of groups that decay into a group without decay; returns
    how many moved."""
    moved = []
    for group in optimizer.param_groups:
        if group.get("weight_decay", 0) > 0:
            moved += [p for p in group["params"] if getattr(p, "no_weight_decay", False)]
            group["params"] = [p for p in group["params"] if not getattr(p, "no_weight_decay", False)]
    if moved:
        optimizer.add_param_group({"params": moved, "weight_decay": 0.0})
    return len(moved)


def install_weight_decay_exemptions() -> None:
    """Wraps ``fairseq.optim.build_optimizer`` (the trainer's and the AMP optimizer's way to build one)."""
    original = optim.build_optimizer
    if getattr(original, "exempts_weight_decay", False):
        return

    def build_optimizer(cfg, params, *args, **kwargs):
        built = original(cfg, params, *args, **kwargs)
        exempt_from_weight_decay(built.optimizer)
        return built

    build_optimizer.exempts_weight_decay = True
    optim.build_optimizer = build_optimizer
