"""A model built from an architecture's name, its flags parsed as fairseq's tools parse them: the one
way the tools, the benchmarks and the tests build a model without a data directory."""

import argparse
from types import SimpleNamespace
from typing import Sequence

from fairseq import options
from fairseq.data import Dictionary

from ..user_dir import USER_DIR
from .capsagg_transformer import CapsAggTransformerModel


def model_args(arch: str, extra: Sequence[str] = (), data: str = "unused") -> argparse.Namespace:
    """fairseq's training arguments of ``arch`` (a translation task, the plugin's ``--user-dir``) with
    ``extra`` flags, later flags winning."""
    return options.parse_args_and_arch(options.get_training_parser(), [
        data, "--task", "translation", "--user-dir", USER_DIR, "--arch", arch, *extra])


def joined_dictionary(size: int) -> Dictionary:
    """A dictionary of ``size`` symbols, fairseq's special ones included (``w0``, ``w1``, ... after them)."""
    dictionary = Dictionary()
    for i in range(size - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def build_model(args: argparse.Namespace, dictionary: Dictionary) -> CapsAggTransformerModel:
    """The model of ``args`` with ``dictionary`` on both sides."""
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    return CapsAggTransformerModel.build_model(args, task)
