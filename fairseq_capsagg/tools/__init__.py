"""Tools around trained models: hub, ``capsagg-translate``, ``capsagg-params``, ``capsagg-health``,
the warm-start loss and the evaluation (BLEU, chrF, significance)."""
