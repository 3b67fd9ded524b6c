"""The by-method table: each method's ΔBLEU per protocol, read from published tables written here."""

import json

import pytest

from fairseq_capsagg.pipeline.by_method import by_method_table, cli_main
from fairseq_capsagg.tools.markdown_block import read_block, write_block

ONE_EPOCH = {"max_update": 900, "warm_updates": 600}
CONVERGED = {"warm_updates": 3000, "patience_updates": 3000, "update_cap": 30000}


def row(name, system, protocol, seed, reference, flags=()):
    return {"name": name, "system": system, "protocol": protocol, "seed": seed, "reference": reference,
            "flags": list(flags), "max_update": 0}


def scored(bleu, delta=None, p=None, average=None, tuned=None):
    result = {"bleu": bleu}
    if delta is not None:
        result.update(delta_bleu=delta, bootstrap_p=p)
    if average is not None:
        result["average"] = average
    if tuned is not None:
        result["tuned"] = tuned
    return result


def publish(folder, name, config, rows, results, failures=None, grid=(0.5, 1.0, 2.0)):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": config, "rows": rows, "results": results, "lenpen_grid": list(grid)}
    if failures is not None:
        payload["failures"] = failures
    path.write_text(json.dumps(payload))


@pytest.fixture
def results_dir(tmp_path):
    publish(tmp_path, "table1-cpu.json", ONE_EPOCH, [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
        row("warm-baseline", "baseline", "warm", 1, "warm-baseline"),
        row("scratch-dyncomb-s1", "dyncomb", "scratch", 1, "scratch-baseline-s1"),
        row("scratch-dyncomb-s2", "dyncomb", "scratch", 2, "scratch-baseline-s1"),
        row("warm-dyncomb", "dyncomb", "warm", 1, "warm-baseline"),
        row("scratch-emrouting-iter1-s1", "emrouting", "scratch", 1, "scratch-baseline-s1", ("--routing-iters", "1")),
        row("scratch-baseline-s2", "baseline", "scratch", 2, "scratch-baseline-s1"),
    ], {"scratch-baseline-s1": scored(7.42), "warm-baseline": scored(10.37),
        "scratch-dyncomb-s1": scored(10.38, 2.96, 0.001), "scratch-dyncomb-s2": scored(10.53, 3.11, 0.03),
        "warm-dyncomb": scored(10.26, -0.11, 0.189), "scratch-emrouting-iter1-s1": scored(6.31, -1.11, 0.001),
        "scratch-baseline-s2": scored(7.36, -0.06, 0.273)})
    publish(tmp_path, "streams/peers-cpu.json", ONE_EPOCH, [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1"),
        row("scratch-hc-s1", "hc", "scratch", 1, "scratch-baseline-s1"),
    ], {"scratch-baseline-s1": scored(7.44), "scratch-hc-s1": scored(10.46, 3.02, 0.001)})
    publish(tmp_path, "converged-cpu.json", CONVERGED, [
        row("converged-baseline-s1", "baseline", "converged", 1, "converged-baseline-s1"),
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1"),
        row("continued-dyncomb", "dyncomb", "continued", 1, "continued-baseline"),
        row("continued-emrouting-encoder", "emrouting", "continued", 1, "continued-baseline",
            ("--decoder-aggregation", "none")),
        row("continued-hc", "hc", "continued", 1, "continued-baseline"),
        row("continued-baseline-s2", "baseline", "continued", 2, "continued-baseline"),
        row("continued-dyncomb-s2", "dyncomb", "continued", 2, "continued-baseline-s2"),
        row("converged-dyncomb-s1", "dyncomb", "converged", 1, "converged-baseline-s1"),
    ], {"converged-baseline-s1": scored(29.0, average=scored(28.98)),
        "continued-baseline": scored(28.93, -0.07, 0.28, average=scored(29.40, 0.42, 0.012)),
        "continued-dyncomb": scored(29.10, 0.17, 0.102, average=scored(29.64, 0.24, 0.021)),
        "continued-baseline-s2": scored(29.02, 0.09, 0.248, average=scored(29.13, -0.27, 0.06)),
        "continued-dyncomb-s2": scored(29.07, 0.05, 0.3, average=scored(29.30, 0.17, 0.008))},
        failures={"continued-hc": "runs/converged/logs/continued-hc.log"})
    return tmp_path


def table_rows(text, table=0):
    """{first cell: the other cells} of the rows of the text's ``table``-th table (the header and the rule left
    out)."""
    tables = [[]]
    for line in text.splitlines():
        if line.startswith("| method") and tables[-1]:
            tables.append([])
        tables[-1].append(line)
    lines = [line for line in tables[table] if line.startswith("| ") and not line.startswith("| method")]
    return {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)}


def test_each_method_reads_its_delta_per_protocol_with_its_seeds_and_marks(results_dir):
    rows = table_rows(by_method_table(results_dir))
    assert rows["Transformer: BLEU"] == ["7.42", "10.37", "28.93", "29.40", "29.00"]
    assert rows["Dynamic Combination"] == ["+2.96† / +3.11*", "−0.11", "+0.17 / +0.05", "+0.24* / +0.17†",
                                           "pending"]
    assert rows["Hyper-connections"] == ["+3.02†", "–", "failed", "failed", "–"]
    assert rows["Transformer, second seed"] == ["−0.06", "–", "+0.09", "−0.27", "–"]
    assert "length penalty" not in by_method_table(results_dir)  # no table tuned its rows


def headers(text):
    """The header lines of the text's tables."""
    return [line for line in text.splitlines() if line.startswith("| method")]


def tune(results_dir, source, tuned):
    """Adds ``tuned`` ({row: its tuned scores}) to the published table ``source``."""
    path = results_dir / source
    payload = json.loads(path.read_text())
    for name, scores in tuned.items():
        payload["results"][name]["tuned"] = scores
    path.write_text(json.dumps(payload))


def test_the_rows_at_their_tuned_length_penalties_are_a_second_table_of_the_protocols_that_have_them(results_dir):
    """The tuned table reads each row's Δ at its own length penalty against its Transformer's tuned BLEU, says
    the grid, notes a Transformer of another table by its tuned BLEU, and leaves the best checkpoints' alone."""
    before = by_method_table(results_dir)
    tune(results_dir, "table1-cpu.json", {"scratch-baseline-s1": scored(7.92), "scratch-dyncomb-s1": scored(10.86, 2.94, 0.001),
                                          "scratch-dyncomb-s2": scored(11.11, 3.19, 0.001),
                                          "scratch-baseline-s2": scored(7.73, -0.19, 0.04)})
    tune(results_dir, "streams/peers-cpu.json", {"scratch-baseline-s1": scored(7.96),
                                                 "scratch-hc-s1": scored(11.13, 3.17, 0.001)})
    text = by_method_table(results_dir)
    assert text.startswith(before.rstrip("\n") + "\n\nAt each row's own length penalty, tuned on the validation "
                           "split (`--lenpen` from 0.5, 1, 2), against its Transformer tuned alike:\n\n")
    assert headers(text)[1] == "| method | one epoch: from scratch, 900 updates |"
    tuned = table_rows(text, table=1)
    assert tuned["Transformer: BLEU"] == ["7.92"]
    assert tuned["Dynamic Combination"] == ["+2.94† / +3.19†"]
    assert tuned["Transformer, second seed"] == ["−0.19*"]
    assert tuned["EM Routing (`--decoder-aggregation none`)"] == ["–"]  # a method only the converged runs list
    assert tuned["Hyper-connections"] == ["+3.17†"]
    assert text.endswith('Hyper-connections in "one epoch: from scratch, 900 updates": against `scratch-baseline-s1` '
                         "of `streams/peers-cpu.json` (BLEU 7.96).\n")


def test_a_later_converged_run_that_tunes_fills_the_tuned_converged_columns_and_not_the_best_checkpoints(
        results_dir):
    """The third converged run tunes every row: its tuned cells, and "pending" for the rows it lists and has not
    scored (an earlier run's failure too: this run will train it), while the best-checkpoint table keeps the first
    run's reading of the rows both scored."""
    publish(results_dir, "converged-run3/converged-cpu.json", CONVERGED, [
        row("converged-baseline-s1", "baseline", "converged", 1, "converged-baseline-s1"),
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1"),
        row("continued-dyncomb", "dyncomb", "continued", 1, "continued-baseline"),
        row("continued-hc", "hc", "continued", 1, "continued-baseline"),
        row("continued-baseline-s2", "baseline", "continued", 2, "continued-baseline"),
        row("continued-dyncomb-s2", "dyncomb", "continued", 2, "continued-baseline-s2"),
        row("converged-dyncomb-s1", "dyncomb", "converged", 1, "converged-baseline-s1"),
    ], {"converged-baseline-s1": scored(28.7, average=scored(28.9), tuned=scored(29.3)),
        "continued-baseline": scored(28.8, -0.1, 0.3, average=scored(29.1), tuned=scored(29.4, 0.1, 0.2)),
        "continued-dyncomb": scored(29.0, 0.2, 0.1, average=scored(29.2, 0.1, 0.2), tuned=scored(29.9, 0.5, 0.004))},
        grid=(0.5, 1.0, 1.5, 2.0, 3.0))
    text = by_method_table(results_dir)
    best, tuned = table_rows(text), table_rows(text, table=1)
    assert best["Dynamic Combination"][2:] == ["+0.17 / +0.05", "+0.24* / +0.17†", "pending"]  # the first run's
    assert best["Hyper-connections"][2:] == ["pending", "pending", "–"]  # the first run's failure, queued again
    assert headers(text)[1] == ("| method | converged: +3,000 from the converged Transformer "
                                "| converged: from scratch (patience 3,000, cap 30,000) |")
    assert "(`--lenpen` from 0.5, 1, 1.5, 2, 3)" in text
    assert tuned["Transformer: BLEU"] == ["29.40", "29.30"]  # no column of the one-epoch tables, which tuned none
    assert tuned["Dynamic Combination"] == ["+0.50† / pending", "pending"]
    assert tuned["Hyper-connections"] == ["pending", "–"]
    assert tuned["Transformer, second seed"] == ["pending", "–"]  # listed by the first run, which tuned nothing


def test_the_converged_comparisons_ablations_are_methods_and_the_others_stay_in_their_tables(results_dir):
    rows = table_rows(by_method_table(results_dir))
    assert rows["EM Routing (`--decoder-aggregation none`)"] == ["–", "–", "pending", "pending", "–"]
    assert not [label for label in rows if "routing-iters" in label]


def test_a_row_measured_against_another_run_of_the_transformer_is_said_so(results_dir):
    """A table that trained its own Transformer, and an aggregator's second seed paired with the Transformer's."""
    text = by_method_table(results_dir)
    assert ('Hyper-connections in "one epoch: from scratch, 900 updates": against `scratch-baseline-s1` of '
            "`streams/peers-cpu.json` (BLEU 7.44).") in text
    assert ('Dynamic Combination (seed 2) in "converged: +3,000 from the converged Transformer": against '
            "`continued-baseline-s2` of `converged-cpu.json` (BLEU 29.02).") in text
    assert "Dynamic Combination in" not in text


def test_a_later_run_scores_what_an_earlier_left_pending_and_says_against_which_transformer(results_dir):
    """The converged comparison's second run (another converged Transformer): its rows fill the first run's
    pending and failed cells, each read against its own run's Transformer; a row both runs scored keeps the
    first run's reading."""
    publish(results_dir, "converged-run2/converged-cpu.json", CONVERGED, [
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1"),
        row("continued-dyncomb", "dyncomb", "continued", 1, "continued-baseline"),
        row("continued-hc", "hc", "continued", 1, "continued-baseline"),
        row("converged-dyncomb-s1", "dyncomb", "converged", 1, "converged-baseline-s1"),
    ], {"continued-baseline": scored(28.81, average=scored(29.2)),
        "continued-dyncomb": scored(28.9, 0.09, 0.3, average=scored(29.1, -0.1, 0.4)),
        "continued-hc": scored(29.12, 0.31, 0.04, average=scored(29.5, 0.3, 0.03))})
    text = by_method_table(results_dir)
    rows = table_rows(text)
    assert rows["Hyper-connections"] == ["+3.02†", "–", "+0.31*", "+0.30*", "–"]
    assert rows["Dynamic Combination"][2:] == ["+0.17 / +0.05", "+0.24* / +0.17†", "pending"]
    assert rows["Transformer: BLEU"][2] == "28.93"
    assert ('Hyper-connections in "converged: +3,000 from the converged Transformer": against `continued-baseline` '
            "of `converged-run2/converged-cpu.json` (BLEU 28.81).") in text


def test_the_columns_and_their_updates_come_from_the_published_configs(results_dir):
    publish(results_dir, "converged-cpu.json", {**CONVERGED, "warm_updates": 5000}, [
        row("continued-baseline", "baseline", "continued", 1, "converged-baseline-s1")], {})
    publish(results_dir, "table1-cpu.json", {**ONE_EPOCH, "max_update": 1200}, [
        row("scratch-baseline-s1", "baseline", "scratch", 1, "scratch-baseline-s1")], {"scratch-baseline-s1":
                                                                                       scored(7.0)})
    header = by_method_table(results_dir).splitlines()[0]
    assert header == ("| method | one epoch: from scratch, 1,200 updates | "
                      "converged: +5,000 from the converged Transformer | the same, last 5 averaged |")


def test_the_cli_writes_the_table_between_its_markers_only(results_dir, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- by-method:begin -->\nold\n<!-- by-method:end -->\nafter\n")
    cli_main(["--results", str(results_dir), "--write", str(page)])
    assert read_block(page, "by-method") == by_method_table(results_dir)
    assert page.read_text().startswith("before\n") and page.read_text().endswith("<!-- by-method:end -->\nafter\n")


def test_a_page_without_the_markers_is_one_clear_error(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("no block here\n")
    with pytest.raises(SystemExit, match=r"<!-- by-method:begin --> \.\.\. <!-- by-method:end -->"):
        write_block(page, "by-method", "table\n")
    assert page.read_text() == "no block here\n"
    with pytest.raises(SystemExit, match="missing.md: no such file"):
        cli_main(["--write", str(tmp_path / "missing.md")])
