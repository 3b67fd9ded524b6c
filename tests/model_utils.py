"""Builds tiny capsagg models through fairseq's own argument parsing."""

from types import SimpleNamespace
from typing import List, Sequence

import torch
from fairseq import options
from fairseq.data import Dictionary

from fairseq_capsagg import USER_DIR

TINY_SHAPE = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
    "--encoder-layers", "3", "--decoder-layers", "3", "--output-capsules", "4",
]


def tiny_dictionary(size: int = 20) -> Dictionary:
    dictionary = Dictionary()
    for i in range(size):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def parse_model_args(arch: str, extra: Sequence[str] = ()):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(
        parser, ["unused-data", "--task", "translation", "--user-dir", USER_DIR, "--arch", arch,
                 *TINY_SHAPE, *extra],
    )


def build_tiny_model(arch: str, extra: Sequence[str] = (), seed: int = 0, dictionary: Dictionary = None):
    """Returns (model, dictionary) for ``arch`` at a tiny shape, in eval mode."""
    torch.manual_seed(seed)
    args = parse_model_args(arch, extra)
    dictionary = dictionary or tiny_dictionary()
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    from fairseq_capsagg.models import CapsAggTransformerModel

    model = CapsAggTransformerModel.build_model(args, task)
    return model.eval(), dictionary


def random_tokens(dictionary: Dictionary, lengths: List[int], seed: int = 0, bos: bool = False):
    """Right-padded (B, T) tokens; sentences end with EOS (or start with it when ``bos``)."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    tokens = torch.full((len(lengths), width), dictionary.pad())
    for i, n in enumerate(lengths):
        body = torch.randint(dictionary.nspecial, len(dictionary), (n - 1,), generator=g)
        end = torch.tensor([dictionary.eos()])
        tokens[i, :n] = torch.cat([end, body]) if bos else torch.cat([body, end])
    return tokens
