"""Checks of the file arguments the tools share: one line naming the flag, before any model loads."""

import argparse
import glob
import os


def check_data_bin(parser: argparse.ArgumentParser, data: str, flag: str = "--data") -> None:
    """Stops with one line unless ``data`` holds fairseq-preprocess's dictionaries."""
    if not glob.glob(os.path.join(glob.escape(data), "dict.*.txt")):
        parser.error(f"{flag} {data}: not a fairseq data-bin (no dict.*.txt; fairseq-preprocess's --destdir)")


def check_checkpoint(parser: argparse.ArgumentParser, path: str, flag: str = "--path") -> None:
    """Stops with one line unless ``path`` is a file."""
    if not os.path.isfile(path):
        parser.error(f"{flag} {path}: no such checkpoint file")
