"""Published tables keep their format: each Markdown table in docs/results is what the Table 1 driver
writes from the JSON published beside it (so a refactoring of the drivers cannot change them)."""

import json
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("path", sorted(RESULTS.glob("**/converged*-cpu.json")), ids=relative)
def test_the_published_converged_tables_are_what_the_driver_writes_from_their_json(path):
    """Every converged table the queue has published (none before its first row is done)."""
    assert converged_table(json.loads(path.read_text())) == path.with_suffix(".md").read_text()
