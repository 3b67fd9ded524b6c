"""Tools around trained models: hub, ``capsagg-translate``, ``capsagg-params``, ``capsagg-health``,
the warm-start loss and the evaluation (BLEU, chrF, significance), and the checks of their file arguments."""
