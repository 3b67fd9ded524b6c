"""The names of a work directory's stages, the keys of its ``stages.json`` (see :class:`.experiment.Stages`):
the data stages, in the order :mod:`.data` runs them, and the stages of each row, named after the row. A stage
that more than one module runs, reads or carries is named here; one that a single function runs and reads stays
there."""

from typing import Iterable, List

#: Unpacking the bundled corpus, training the subword model, binarising the splits (:mod:`.data`).
CORPUS, SUBWORDS, BINARISE = "corpus", "subwords", "binarise"
DATA_STAGES = (CORPUS, SUBWORDS, BINARISE)

#: The validation loss at step 0 of every aggregator warm-started from the Transformer (the main job, Table 1).
STEP0_WARM_STARTS = "validation loss at step 0 of warm starts"

_TRAIN = "train "


def train(row: str) -> str:
    """The stage that trains ``row``; its record is what the training measured."""
    return _TRAIN + row


def translate_and_score(row: str, variant: str = "") -> str:
    """The stage that decodes the test split with ``row``'s model and scores it (``variant``: the checkpoint's
    suffix, such as ``.average``, when a row is scored with more than one)."""
    return f"translate and score {row}" + (f" ({variant.lstrip('.')})" if variant else "")


def average(row: str) -> str:
    """The stage that averages ``row``'s last interval checkpoints (a converged row)."""
    return f"average {row}"


def score_references(row: str) -> str:
    """The stage that scores the references under ``row``'s model (``fairseq-generate --score-reference``)."""
    return f"score references {row}"


def trained_rows(stages: Iterable[str]) -> List[str]:
    """The rows whose training stage is among ``stages``, in their order (for ``stages.json``: the order in which
    they finished)."""
    return [stage[len(_TRAIN):] for stage in stages if stage.startswith(_TRAIN)]
