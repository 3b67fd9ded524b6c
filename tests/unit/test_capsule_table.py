"""``capsagg-table1 --table capsules``: dynamic routing from scratch at several capsule widths with both routing
softmaxes, beside the paper's table's Transformer (the rows it shares with that table's work directory)."""

import json

import pytest

from fairseq_capsagg.pipeline.drivers import table1
from fairseq_capsagg.pipeline.drivers.table1_rows import SWEEP_CAPSULES


def test_the_capsule_table_sweeps_every_width_with_both_softmaxes_against_the_transformer():
    args = table1.parse_args(["--table", "capsules", "--rows", "scratch-dynrouting-n16-s1"])
    rows = table1.rows_of(args)
    assert args.workdir.name == "table1" and table1.table_stem(args) == "dynrouting-capsules"
    assert rows[0].name == "scratch-baseline-s1" and {r.reference for r in rows} == {"scratch-baseline-s1"}
    swept = {(dict(zip(r.flags[::2], r.flags[1::2]))["--output-capsules"],
              dict(zip(r.flags[::2], r.flags[1::2]))["--routing-softmax"]) for r in rows[1:]}
    assert swept == {(str(n), softmax) for n in SWEEP_CAPSULES for softmax in ("output", "input")}
    assert all(128 % n == 0 for n in SWEEP_CAPSULES)  # small's d: every width a divisor
    assert {r.system for r in rows[1:]} == {"dynrouting"} and all(r.protocol == "scratch" for r in rows)


def test_a_row_of_another_table_is_refused_with_the_capsule_tables_rows():
    with pytest.raises(SystemExit):
        table1.parse_args(["--table", "capsules", "--rows", "warm-emrouting"])


def _result(reference: str, bleu: float, chrf: float = 30.0) -> dict:
    return {"reference": reference, "bleu": bleu, "chrf": chrf}


def test_published_rows_are_kept_only_while_their_reference_scores_the_same_here():
    published = {"scratch-baseline-s1": _result("scratch-baseline-s1", 7.44),
                 "scratch-dynrouting-n8-s1": _result("scratch-baseline-s1", 2.04),
                 "scratch-dynrouting-n16-s1": _result("scratch-baseline-s1", 1.0)}
    here = {"scratch-baseline-s1": _result("scratch-baseline-s1", 7.44),
            "scratch-dynrouting-n16-s1": _result("scratch-baseline-s1", 3.0)}
    assert table1.kept_published(published, here) == {"scratch-dynrouting-n8-s1": published["scratch-dynrouting-n8-s1"]}
    retrained = {"scratch-baseline-s1": _result("scratch-baseline-s1", 7.45)}  # another model: comparisons void
    assert table1.kept_published(published, retrained) == {}
    assert table1.kept_published(published, {}) == {}


def test_the_published_capsule_table_is_read_and_one_of_other_settings_refused(tmp_path, capsys):
    args = table1.parse_args(["--table", "capsules", "--publish", str(tmp_path)])
    assert args.published_results == {}
    rows = {"scratch-dynrouting-n8-s1": _result("scratch-baseline-s1", 2.04)}
    published = tmp_path / "dynrouting-capsules-cpu.json"
    published.write_text(json.dumps({"config": table1.config_of(args), "results": rows}))
    assert table1.parse_args(["--table", "capsules", "--publish", str(tmp_path)]).published_results == rows
    with pytest.raises(SystemExit):
        table1.parse_args(["--table", "capsules", "--publish", str(tmp_path), "--max-update", "100"])
    assert "--publish" in capsys.readouterr().err
