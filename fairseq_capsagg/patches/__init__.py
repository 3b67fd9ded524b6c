"""The plugin's changes to fairseq's own behaviour, all installed by :func:`install`.

* :mod:`.cli_errors`: an uncaught :class:`~fairseq_capsagg.aggregators.AggregationConfigError`
  prints one ``TOOL: error:`` line instead of a traceback.
* :mod:`.durable_checkpoints`: fairseq's checkpoint copies (``checkpoint_last.pt``,
  ``checkpoint_best.pt``) become atomic.
* :mod:`.safe_checkpoints`: torch's ``weights_only`` loader accepts the few globals fairseq
  writes into checkpoints, and nothing else.
* :mod:`.interactive_guard`: ``fairseq-interactive`` keeps translating past lines it cannot read
  (with :mod:`fairseq_capsagg.input_repair`).
* :mod:`.resumable_batches`: a training resumed from a checkpoint in a later epoch draws the batches the
  uninterrupted training draws (fairseq draws them again with the epoch it resumes in).
* :mod:`.trained_settings`: a checkpoint saved before its architecture set a setting loads with the value it
  was trained with.
* :mod:`.weight_decay`: parameters marked ``no_weight_decay`` (the residual streams' static weights)
  get no weight decay.

None of them changes what a stock fairseq flag does (see ``tests/integration/test_patches.py``); resuming
does what it promises (``tests/integration/test_reliability.py``).
"""

from .cli_errors import install_error_hook
from .durable_checkpoints import install_atomic_checkpoint_copies
from .interactive_guard import install_interactive_guard
from .resumable_batches import install_resumable_batches
from .safe_checkpoints import allow_fairseq_checkpoint_globals
from .trained_settings import install_trained_settings
from .weight_decay import install_weight_decay_exemptions


def install() -> None:
    """Installs every patch (idempotent)."""
    install_error_hook()
    install_atomic_checkpoint_copies()
    allow_fairseq_checkpoint_globals()
    install_interactive_guard()
    install_resumable_batches()
    install_trained_settings()
    install_weight_decay_exemptions()
