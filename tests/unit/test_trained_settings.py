"""A checkpoint saved before its architecture set a setting keeps the value it was trained with
(patches/trained_settings.py)."""

from argparse import Namespace

from fairseq import checkpoint_utils

import fairseq_capsagg  # noqa: F401  (installs the patches)
from fairseq_capsagg.patches.trained_settings import keep_trained_settings


def test_an_unset_capsule_count_of_a_dynamic_routing_architecture_is_read_as_the_n_equal_d_it_trained_with():
    old = Namespace(arch="transformer_dynrouting_small", output_capsules=None, encoder_embed_dim=128)
    keep_trained_settings(old)
    assert old.output_capsules == 128
    explicit = Namespace(arch="transformer_dynrouting_base", output_capsules=8, encoder_embed_dim=512)
    keep_trained_settings(explicit)
    assert explicit.output_capsules == 8
    other = Namespace(arch="transformer_emrouting_small", output_capsules=None, encoder_embed_dim=128)
    keep_trained_settings(other)
    assert other.output_capsules is None  # EM routing's architectures still leave it to the flag's default


def test_every_checkpoint_load_runs_through_it():
    assert checkpoint_utils._upgrade_state_dict.keeps_trained_settings
