"""Lets checkpoints without aggregator weights (a vanilla Transformer) load strictly."""

import logging
from typing import Dict

from torch import Tensor, nn

logger = logging.getLogger(__name__)


def fill_missing_keys(module: nn.Module, state_dict: Dict[str, Tensor], prefix: str) -> Dict[str, Tensor]:
    """Copies ``module``'s freshly initialised tensors into ``state_dict`` under
    ``prefix`` where the checkpoint has none.

    A checkpoint of our own holds every key and is left untouched; a vanilla
    Transformer checkpoint (``--finetune-from-model``) gains the aggregator's
    initial weights, so fairseq's strict loading succeeds and every shared
    weight comes from the checkpoint.
    """
    own = module.state_dict()
    if not own or any(key.startswith(prefix + ".") for key in state_dict):
        return state_dict
    for key, value in own.items():
        state_dict[f"{prefix}.{key}"] = value.detach().clone()
    logger.info("initialised %d aggregator tensors of %s (absent from the checkpoint)", len(own), prefix)
    return state_dict
