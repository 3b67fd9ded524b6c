"""What the queue's ``status`` prints (fairseq_capsagg.pipeline.progress): the rows trained, and each unfinished
row's update, speed, validations and where it stops, read from its fairseq logs."""

import io
import json
import os

import pytest

from fairseq_capsagg.pipeline import progress
from helpers import TRAIN_LOG

#: The arguments line of a fairseq-train log of a row of fixed length (Table 1, the peers).
MAX_UPDATE_60 = "2026-11-27 08:38:00 | INFO | fairseq_cli.train | {'optimization': {'max_update': 60, 'lr': [0.002]}}\n"


def test_the_progress_of_unfinished_rows_is_read_from_their_logs(tmp_path):
    """What the queue's status prints: each unfinished row's update, validations and where its rule stops it;
    finished rows are left to the table."""
    (tmp_path / "config.json").write_text(json.dumps({"validate_interval_updates": 10, "patience_updates": 30,
                                                      "update_cap": 100, "warm_updates": 40}))
    (tmp_path / "stages.json").write_text(json.dumps({"train converged-mudd-s1": {}}))
    for name in ("converged-mudd-s1", "converged-baseline-s1", "continued-dyncomb"):
        (tmp_path / "logs" / f"train-{name}").mkdir(parents=True)
        (tmp_path / "logs" / f"train-{name}" / "from-0.log").write_text(TRAIN_LOG)
    (tmp_path / "logs" / "train-converged-dwa-s1").mkdir()  # made, nothing logged yet
    validations = "validation loss 9.336 at 10, 9.066 at 20"
    assert sorted(progress.progress(tmp_path, progress.trained(tmp_path))) == [
        f"continued-dyncomb: update 20 (0.17 updates/s lately); {validations}; stops at 40 (in about 2 min)",
        f"converged-baseline-s1: update 20 (0.17 updates/s lately); {validations}; stops at 50 (in about 3 min) "
        "unless a later validation is better (cap 100, in about 8 min)"]


def test_the_progress_of_rows_of_fixed_length_is_read_from_their_logs(tmp_path):
    """In a work directory of Table 1 or the peers (one log per row, no stop rule): each unfinished row's
    update and the ``--max-update`` its log names; finished rows are left to the table."""
    (tmp_path / "config.json").write_text(json.dumps({"max_update": 900, "warm_updates": 600}))
    (tmp_path / "stages.json").write_text(json.dumps({"train scratch-baseline-s1": {}}))
    (tmp_path / "logs").mkdir()
    for name in ("scratch-baseline-s1", "time-hc-s1"):
        (tmp_path / "logs" / f"train-{name}.log").write_text(MAX_UPDATE_60 + TRAIN_LOG)
    assert progress.progress(tmp_path, progress.trained(tmp_path)) == [
        "time-hc-s1: update 20 (0.17 updates/s lately); validation loss 9.336 at 10, 9.066 at 20; "
        "stops at 60 (in about 4 min)"]


def test_a_row_in_training_is_compared_with_the_same_row_of_a_published_table(tmp_path):
    """``--against``: the same network trained again says so; another says its largest gap and where; a row the
    table does not hold, or holds without a shared validation, says nothing."""
    (tmp_path / "config.json").write_text(json.dumps({"validate_interval_updates": 10, "patience_updates": 30,
                                                      "update_cap": 100, "warm_updates": 40}))
    for name in ("converged-baseline-s1", "converged-mudd-s1", "converged-dwa-s1", "continued-dyncomb"):
        (tmp_path / "logs" / f"train-{name}").mkdir(parents=True)
        (tmp_path / "logs" / f"train-{name}" / "from-0.log").write_text(TRAIN_LOG)
    curve = lambda *losses: [{"update": 10 * (i + 1), "loss": loss} for i, loss in enumerate(losses)]  # noqa: E731
    published = tmp_path / "published.json"
    published.write_text(json.dumps({"results": {
        "converged-baseline-s1": {"curve": curve(9.336, 9.066, 8.5)},  # the same at both of its validations
        "converged-mudd-s1": {"curve": curve(9.352, 9.062)},
        "converged-dwa-s1": {"curve": [{"update": 500, "loss": 7.0}]}}}))
    lines = {line.split(":")[0]: line for line in progress.progress(tmp_path, [], [published])}
    assert lines["converged-baseline-s1"].endswith("; against published.json: the same at all 2 validations")
    assert lines["converged-mudd-s1"].endswith("; against published.json: largest gap 0.016 at 10 (2 validations)")
    assert lines["converged-dwa-s1"].endswith("(cap 100, in about 8 min)")
    assert "against" not in lines["continued-dyncomb"]


def test_a_row_in_training_is_compared_with_every_published_run_in_the_order_given(tmp_path, capsys):
    """``--against`` once per earlier run: one clause per table that holds the row, each named by its place under
    docs/results (two runs' tables share a file name)."""
    (tmp_path / "config.json").write_text(json.dumps({"validate_interval_updates": 10, "patience_updates": 30,
                                                      "update_cap": 100, "warm_updates": 40}))
    (tmp_path / "logs" / "train-converged-baseline-s1").mkdir(parents=True)
    (tmp_path / "logs" / "train-converged-baseline-s1" / "from-0.log").write_text(TRAIN_LOG)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"results": {"converged-baseline-s1": {"curve": [{"update": 10, "loss": 9.336}]}}}))
    second.write_text(json.dumps({"results": {"converged-baseline-s1": {"curve": [{"update": 20, "loss": 9.07}]}}}))
    assert progress.main([str(tmp_path), "--against", str(second), "--against", str(first)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(
        "; against second.json: largest gap 0.004 at 20 (1 validations)"
        "; against first.json: the same at all 1 validations")
    assert progress.table_label(progress.RESULTS / "converged-run2" / "converged-cpu.json") == \
        "converged-run2/converged-cpu.json"


def test_the_progress_command_refuses_a_missing_published_table(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"max_update": 900, "warm_updates": 600}))
    with pytest.raises(SystemExit) as exit_info:
        progress.main([str(tmp_path), "--against", str(tmp_path / "nowhere.json")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m fairseq_capsagg.pipeline.progress: error: --against: {tmp_path / 'nowhere.json'} does not exist")


def test_the_speed_lately_is_the_median_of_the_last_stretches():
    """A stretch that shared the cores (tests, a paused queue) does not swing the estimate; older ones drop out."""
    stretch = lambda ups: {"ups": ups, "num_updates": 0}  # noqa: E731
    assert progress.recent_speed([]) == 0.0
    assert progress.recent_speed([stretch(u) for u in (0.2, 1.1, 1.0, 1.2, 0.07)]) == 1.0
    assert progress.recent_speed([stretch(u) for u in (0.01, 0.01, 0.01, 1.1, 1.0, 1.2, 0.9, 0.07)]) == 1.0


@pytest.mark.parametrize("updates,ups,said", [(3000, 1.0, " (in about 50 min)"), (9000, 1.0, " (in about 2.5 h)"),
                                              (100, 0.0, ""), (0, 1.0, "")])
def test_the_time_left_is_said_in_minutes_then_hours(updates, ups, said):
    assert progress.time_left(updates, ups) == said


def test_the_progress_command_refuses_a_directory_that_is_not_a_work_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        progress.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m fairseq_capsagg.pipeline.progress: error: {tmp_path} is not a work directory of "
        "capsagg-table1 (no config.json)")


def test_the_progress_command_names_the_rows_trained_then_the_rows_training(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"max_update": 900, "warm_updates": 600}))
    progress.main([str(tmp_path)])  # nothing started yet
    assert capsys.readouterr().out == f"{tmp_path}: rows trained: none yet\n"
    (tmp_path / "stages.json").write_text(json.dumps({"corpus": {}, "train scratch-baseline-s1": {},
                                                      "translate scratch-baseline-s1": {}, "train warm-linagg": {}}))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "train-time-hc-s1.log").write_text(MAX_UPDATE_60 + TRAIN_LOG)
    progress.main([str(tmp_path)])
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path}: rows trained: scratch-baseline-s1, warm-linagg",
        "time-hc-s1: update 20 (0.17 updates/s lately); validation loss 9.336 at 10, 9.066 at 20; "
        "stops at 60 (in about 4 min)"]


def test_the_progress_command_ends_quietly_when_its_reader_stops_reading(tmp_path, monkeypatch):
    """``converged_queue.sh status | head -1``: the pipe's reader is gone before the command has printed; it
    returns 0 as a command cut short should, not with a BrokenPipeError (a traceback on standard error)."""
    (tmp_path / "config.json").write_text(json.dumps({"max_update": 900, "warm_updates": 600}))
    read_end, write_end = os.pipe()
    os.close(read_end)
    pipe = io.TextIOWrapper(io.FileIO(write_end, "w"), line_buffering=True)
    monkeypatch.setattr("sys.stdout", pipe)
    assert progress.main([str(tmp_path)]) == 0
    pipe.write("written after the reader left\n")
    pipe.flush()  # what is left goes nowhere, as it does at the interpreter's exit
    pipe.close()
