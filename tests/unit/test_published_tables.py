"""Published tables keep their format: each Markdown table in docs/results is what the Table 1 driver
writes from the JSON published beside it (so a refactoring of the drivers cannot change them); and no
published result is lost to a later run that has not scored it."""

import argparse
import json
from pathlib import Path

import pytest

from fairseq_capsagg.pipeline.reports import publish
from helpers import ROOT
from published import converged_table, table1_table

RESULTS = ROOT / "docs" / "results"


#: The paper's table and every peers table published.
PAPER_AND_PEERS = [(RESULTS / "table1-cpu.json", "paper"),
                   *((path, "peers") for path in sorted(RESULTS.glob("**/peers-cpu.json")))]


def relative(value):
    """A parameter's name in the test's id: a published file relative to docs/results."""
    return str(value.relative_to(RESULTS)) if isinstance(value, Path) else value


@pytest.mark.parametrize("path,table", PAPER_AND_PEERS, ids=relative)
def test_the_published_table_is_what_the_driver_writes_from_its_json(path, table):
    assert table1_table(json.loads(path.read_text()), table) == path.with_suffix(".md").read_text()


#: Every converged table published, on a CPU or a GPU.
CONVERGED = sorted(path for device in ("cpu", "gpu") for path in RESULTS.glob(f"**/converged*-{device}.json"))


@pytest.mark.parametrize("path", CONVERGED, ids=relative)
def test_the_published_converged_tables_are_what_the_driver_writes_from_their_json(path):
    assert converged_table(json.loads(path.read_text())) == path.with_suffix(".md").read_text()


def test_a_published_table_names_its_device_and_a_figure_only_a_gpu(tmp_path):
    for gpu, expected in ((False, {"converged-cpu.md", "converged-cpu.json", "curves.png"}),
                          (True, {"converged-gpu.md", "converged-gpu.json", "curves-gpu.png"})):
        args = argparse.Namespace(gpu=gpu, workdir=tmp_path / "work", publish=tmp_path / f"published-{gpu}")
        args.workdir.mkdir(exist_ok=True)
        (args.workdir / "curves.png").write_bytes(b"png")
        publish.write_outputs(args, "converged", "table\n", {"rows": []}, [args.workdir / "curves.png"])
        assert {p.name for p in args.publish.iterdir()} == expected
        assert (args.publish / sorted(expected)[1]).read_text() == "table\n"
    assert publish.published_name("compute-equivalence.md", False, device_suffix=False) == "compute-equivalence.md"
    assert publish.published_name("compute-equivalence.md", True, device_suffix=False) == "compute-equivalence-gpu.md"
