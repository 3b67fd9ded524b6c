"""What every driver shares: one process per work directory, a work directory of one configuration, the
one --quick mode, the tables' note on sentences scored as empty, the names of the stages it records."""

import argparse
import json
import os

import pytest

from fairseq_capsagg.pipeline.reports import report

from fairseq_capsagg.pipeline import stage_names
from fairseq_capsagg.pipeline.experiment import (
    MAX_LEN,
    QUICK,
    QUICK_MAX_LEN,
    ConfigMismatch,
    WorkdirBusy,
    add_setup_flags,
    apply_quick,
    hparams,
    open_workdir,
)


def test_a_second_run_in_the_same_work_directory_is_refused_while_the_first_holds_it(tmp_path):
    first = open_workdir(tmp_path, {"lr": 0.002})
    with pytest.raises(WorkdirBusy, match=rf"{tmp_path} is in use by another run \(pid {os.getpid()}\)"):
        open_workdir(tmp_path, {"lr": 0.002})
    first.close()  # the first run ends: its lock goes with it
    open_workdir(tmp_path, {"lr": 0.002})


def test_a_work_directory_of_another_configuration_is_refused(tmp_path):
    open_workdir(tmp_path / "w", {"lr": 0.002}).close()
    with pytest.raises(ConfigMismatch, match=r"holds results of another configuration \(lr: 0.002 -> 0.01\)"):
        open_workdir(tmp_path / "w", {"lr": 0.01})


def test_quick_sets_only_the_flags_a_driver_has_and_hparams_follow_the_flags():
    parser = argparse.ArgumentParser()
    add_setup_flags(parser)
    args = parser.parse_args(["--quick"])
    apply_quick(args)
    assert (args.max_update, args.beam, args.max_tokens) == (QUICK["max_update"], QUICK["beam"], QUICK["max_tokens"])
    assert not hasattr(args, "warm_updates")  # a flag this driver lacks is not added
    hp = hparams(args, ("en", "de"), "sentencepiece", seed=3)
    assert hp["device_flags"] == ["--cpu"] and hp["decode_batch"] == 32 and hp["seed"] == 3 and hp["log_interval"] == 5
    assert hp["max_len"] == QUICK_MAX_LEN
    full = hparams(parser.parse_args(["--gpu"]), ("en", "de"), "sentencepiece")
    assert full["decode_batch"] == 128 and full["max_len"] == MAX_LEN == (1.2, 10)


def test_a_table_names_the_sentences_it_scores_as_empty_and_the_rows_that_do():
    assert report.format_untranslated({"a": {"untranslated_ids": []}, "b": {}}) == ""
    every = report.format_untranslated({"a": {"untranslated_ids": [5, 9]}, "b": {"untranslated_ids": [5, 9]}})
    assert every.startswith("Test sentences scored as empty hypotheses") and every.endswith(": 5, 9 in every row.")
    some = report.format_untranslated({"a": {"untranslated_ids": [5]}, "b": {"untranslated_ids": []},
                                       "c": {"untranslated_ids": [7]}})
    assert some.endswith(": 5 in `a`; 7 in `c`.")


def test_stage_names_are_those_existing_work_directories_hold_and_trained_rows_reads_them_back(tmp_path):
    # the stages.json of work directories in use hold these keys: a renamed stage would retrain a row
    assert stage_names.DATA_STAGES == ("corpus", "subwords", "binarise")
    assert stage_names.train("converged-baseline-s1") == "train converged-baseline-s1"
    assert stage_names.average("converged-mudd-s1") == "average converged-mudd-s1"
    assert stage_names.translate_and_score("converged-mudd-s1", ".average") == (
        "translate and score converged-mudd-s1 (average)")
    stages = open_workdir(tmp_path, {"lr": 0.002})
    for stage in ["corpus", stage_names.train("b"), stage_names.translate_and_score("b"), stage_names.train("a"),
                  stage_names.average("a")]:
        stages.run(stage, dict)
    stages.close()
    assert stage_names.trained_rows(json.loads((tmp_path / "stages.json").read_text())) == ["b", "a"]
