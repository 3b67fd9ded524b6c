"""``capsagg-translate``'s command line: every flag explains itself, bad values are one error line."""

import argparse

import pytest

from fairseq_capsagg.tools.translate import build_parser, cli_main


def test_every_flag_has_help_text():
    actions = [a for a in build_parser()._actions if not isinstance(a, argparse._HelpAction)]
    assert actions and all(a.help and a.help.strip() for a in actions), [a.dest for a in actions if not a.help]


def test_a_beam_below_one_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as stop:
        cli_main(["--model-dir", "m", "--data", "d", "--bpe-codes", "c", "--beam", "0"])
    assert stop.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == ["capsagg-translate: error: --beam: got 0; it must be an integer >= 1"]
