"""fairseq_capsagg: dynamic layer aggregation for fairseq Transformers.

Implements Dou et al. (AAAI 2019), "Dynamic Layer Aggregation for Neural
Machine Translation with Routing-by-Agreement".

* :mod:`fairseq_capsagg.aggregators`: the aggregators and their registry (torch only): the
  paper's four and six later peers (DenseFormer's DWA, attention over depth, MUDD, DLCL,
  hyper-connections, mHC).
* :mod:`fairseq_capsagg.models`: the ``capsagg_transformer`` fairseq model, its aggregation at
  the stacks' output and dense connections between blocks, and its
  ``transformer_{family}_{base,big,small}`` architectures.
* :mod:`fairseq_capsagg.patches`: the plugin's changes to fairseq's behaviour.
* :mod:`fairseq_capsagg.tools`: hub, translation, parameter counts, warm-start loss, the flags table and the
  README's generated blocks.
* :mod:`fairseq_capsagg.analysis`: scoring and significance, the paper's analyses, the health report.
* :mod:`fairseq_capsagg.pipeline`: the experiment drivers (the main job, Table 1 and its peers and
  converged comparisons) and the by-method summary of their published tables.
* :mod:`fairseq_capsagg.input_repair`: how a bad input line is repaired (used by the tools and the
  ``fairseq-interactive`` guard); :mod:`fairseq_capsagg.user_dir`: the plugin's ``--user-dir``.

Each room imports only from those above it in this list (tested); the two leaves from none.

Importing the package (or passing ``--user-dir`` to a fairseq tool) registers the model and
its architectures and installs the patches, when fairseq is installed; without fairseq,
:mod:`fairseq_capsagg.aggregators` still works on its own.
"""

import logging
import os

from .user_dir import USER_DIR

# Importing fairseq runs ``logging.basicConfig(level=DEBUG)`` (fairseq/models/wav2vec/
# wav2vec2_classification.py), so a tool that imports it before configuring logging prints every
# library's debug lines. Configure it first as fairseq's own CLIs do (LOGLEVEL, default INFO), on
# stderr so that stdout keeps only a tool's output; a no-op where logging is already configured
# (fairseq-train loading the plugin with --user-dir).
logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
    datefmt="%Y-%m-%d %H:%M:%S",
    level=os.environ.get("LOGLEVEL", "INFO").upper(),
)

try:
    import fairseq  # noqa: F401
except ImportError:  # torch-only use of fairseq_capsagg.aggregators
    HAS_FAIRSEQ = False
else:
    HAS_FAIRSEQ = True

if HAS_FAIRSEQ:
    from . import models  # noqa: F401 (registers the model and architectures)
    from .patches import install as _install_patches

    _install_patches()

__all__ = ["USER_DIR"]
