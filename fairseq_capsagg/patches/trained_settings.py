"""Checkpoints keep the settings they were trained with when an architecture's values change.

fairseq builds a model from a checkpoint by running its architecture function on the saved arguments again
(``fairseq.models.build_model``): a setting the saved arguments leave unset takes what the architecture sets
today. Where a family's architectures began to set one (:attr:`~..aggregators.LayerAggregator.architecture_settings`),
:data:`TRAINED_WITH` gives the value the checkpoints saved before were trained with, and fairseq's checkpoint
upgrade writes it into their arguments, so an old model loads as it was trained, not silently as another.
"""

from argparse import Namespace
from typing import Callable, Dict

from fairseq import checkpoint_utils

#: Per family, each setting its architectures set since a change, and what its checkpoints saved before that (the
#: setting unset) were trained with, from their arguments: dynamic routing's architectures used N = d output
#: capsules until they set ``--output-capsules``.
TRAINED_WITH: Dict[str, Dict[str, Callable[[Namespace], object]]] = {
    "dynrouting": {"output_capsules": lambda args: args.encoder_embed_dim},
}


def keep_trained_settings(model_args: Namespace) -> None:
    """Writes :data:`TRAINED_WITH`'s value into the saved arguments of a checkpoint whose architecture's family
    sets a setting today that these arguments leave unset."""
    arch = getattr(model_args, "arch", "") or ""
    for family, settings in TRAINED_WITH.items():
        if not arch.startswith(f"transformer_{family}_"):
            continue
        for name, trained_with in settings.items():
            if getattr(model_args, name, None) is None:
                setattr(model_args, name, trained_with(model_args))


def install_trained_settings() -> None:
    """Wraps fairseq's checkpoint upgrade (run by every checkpoint load) with :func:`keep_trained_settings`
    (idempotent)."""
    upgrade = checkpoint_utils._upgrade_state_dict
    if getattr(upgrade, "keeps_trained_settings", False):
        return

    def upgrade_keeping_trained_settings(state):
        state = upgrade(state)
        cfg = state.get("cfg")
        model_args = None if cfg is None else cfg.get("model")
        if isinstance(model_args, Namespace):
            keep_trained_settings(model_args)
        return state

    upgrade_keeping_trained_settings.keeps_trained_settings = True
    checkpoint_utils._upgrade_state_dict = upgrade_keeping_trained_settings
