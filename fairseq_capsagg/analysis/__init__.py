"""The paper's analyses: agreement (Eqs. 18-19), BLEU by length, sweeps and ablations; the peers' depth weights."""

from .statistics import agreement_diversity, agreement_entropy

__all__ = ["agreement_diversity", "agreement_entropy"]
