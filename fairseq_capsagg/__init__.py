"""fairseq_capsagg: dynamic layer aggregation for fairseq Transformers.

Implements Dou et al. (AAAI 2019), "Dynamic Layer Aggregation for Neural
Machine Translation with Routing-by-Agreement". Importing the package (or
passing ``--user-dir`` to a fairseq tool) registers the ``capsagg_transformer``
model and its ``transformer_{linagg,dyncomb,dynrouting,emrouting}_{base,big,small}``
architectures.
"""

import os

from . import models  # noqa: F401 (registers the model and architectures)
from .aggregators import AggregationConfigError, build_aggregator
from .cli_errors import install_error_hook
from .durable_checkpoints import install_atomic_checkpoint_copies
from .interactive_guard import install_interactive_guard
from .safe_checkpoints import allow_fairseq_checkpoint_globals

USER_DIR = os.path.dirname(os.path.abspath(__file__))

install_error_hook()
install_atomic_checkpoint_copies()
allow_fairseq_checkpoint_globals()
install_interactive_guard()

__all__ = ["USER_DIR", "AggregationConfigError", "build_aggregator"]
