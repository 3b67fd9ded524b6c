"""Published tables keep their format: each Markdown table in docs/results is what the Table 1 driver
writes from the JSON published beside it (so a refactoring of the drivers cannot change them); and no
published result is lost to a later run that has not scored it."""

import argparse
import json
from pathlib import Path

import pytest

from fairseq_capsagg.pipeline import publish
from helpers import ROOT
from published import converged_table, table1_table

RESULTS = ROOT / "docs" / "results"


#: The paper's table and every peers table published (docs/results/streams/ once the queue has run it).
PAPER_AND_PEERS = [(RESULTS / "table1-cpu.json", "paper"),
                   *((path, "peers") for path in sorted(RESULTS.glob("**/peers-cpu.json")))]


def relative(value):
    """A parameter's name in the test's id: a published file relative to docs/results."""
    return str(value.relative_to(RESULTS)) if isinstance(value, Path) else value


@pytest.mark.parametrize("path,table", PAPER_AND_PEERS, ids=relative)
def test_the_published_table_is_what_the_driver_writes_from_its_json(path, table):
    assert table1_table(json.loads(path.read_text()), table) == path.with_suffix(".md").read_text()


#: Every converged table published, by the CPU queue or a lent GPU.
CONVERGED = sorted(path for device in ("cpu", "gpu") for path in RESULTS.glob(f"**/converged*-{device}.json"))


@pytest.mark.parametrize("path", CONVERGED, ids=relative)
def test_the_published_converged_tables_are_what_the_driver_writes_from_their_json(path):
    """Every converged table the queue (and a lent GPU) has published (none before its first row is done)."""
    assert converged_table(json.loads(path.read_text())) == path.with_suffix(".md").read_text()


def test_a_table_is_not_published_over_results_it_has_not_scored(tmp_path, capsys):
    """A work directory lost with its machine starts again with every row pending: its first report must not
    replace the published table that holds the lost rows' results. It keeps its own copy, says on stderr which
    rows and what to do, and publishes again once it has scored them (or no longer lists them)."""
    args = argparse.Namespace(gpu=False, workdir=tmp_path / "work", publish=tmp_path / "published")
    args.workdir.mkdir()
    rows = [{"name": "converged-baseline-s1"}, {"name": "continued-baseline"}]
    both = {"converged-baseline-s1": {"bleu": 29.0}, "continued-baseline": {"bleu": 28.93}}
    publish.write_outputs(args, "converged", "both scored\n", {"rows": rows, "results": both})
    published = args.publish / "converged-cpu.json"
    assert json.loads(published.read_text())["results"] == both

    one = {"converged-baseline-s1": {"bleu": 28.8}}
    publish.write_outputs(args, "converged", "one pending\n", {"rows": rows, "results": one})
    err = capsys.readouterr().err
    assert "not published to" in err and "continued-baseline" in err and "--publish DIR" in err
    assert json.loads(published.read_text())["results"] == both
    assert (args.publish / "converged-cpu.md").read_text() == "both scored\n"
    assert (args.workdir / "converged.md").read_text() == "one pending\n"

    publish.write_outputs(args, "converged", "one row\n", {"rows": rows[:1], "results": one})
    assert (args.publish / "converged-cpu.md").read_text() == "one row\n"
    assert capsys.readouterr().err == ""
