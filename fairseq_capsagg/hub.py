"""Loading trained models through fairseq's hub interface."""

from pathlib import Path
from typing import Union

import torch

from . import USER_DIR
from .safe_checkpoints import check_checkpoint


def from_pretrained(model_dir: Union[str, Path], checkpoint_file: str = "checkpoint_best.pt",
                    data_name_or_path: Union[str, Path] = ".", **kwargs):
    """``TransformerModel.from_pretrained`` with this plugin's ``user_dir`` filled in.

    The checkpoint is first checked for pickled globals beyond those fairseq
    writes (see :mod:`fairseq_capsagg.safe_checkpoints`); it is then loaded
    with torch's ``weights_only=True``.

    Example::

        from fairseq_capsagg.hub import from_pretrained
        model = from_pretrained("runs/main/checkpoints/emrouting", "checkpoint_last.pt",
                                data_name_or_path="runs/main/data-bin", bpe="sentencepiece",
                                sentencepiece_model="runs/main/spm/spm.model")
        model.translate("Open the file.")

    Returns:
        a fairseq ``GeneratorHubInterface``.
    """
    from fairseq.models.transformer import TransformerModel

    check_checkpoint(Path(model_dir) / checkpoint_file)
    kwargs.setdefault("user_dir", USER_DIR)
    hub = TransformerModel.from_pretrained(str(model_dir), checkpoint_file=checkpoint_file,
                                           data_name_or_path=str(data_name_or_path), **kwargs)
    hub.eval()
    if not torch.cuda.is_available():
        hub.cpu()
    return hub
