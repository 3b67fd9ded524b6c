"""The README and docs/: the results table reads what the JSON it cites says, the by-method and replication
tables are what the published JSON say, the flags table is the parser's, and every local link and every file of
the repository they name exists."""

import json
import re

import pytest

from fairseq_capsagg.pipeline.by_method import by_method_table
from fairseq_capsagg.pipeline.replication import replication_table
from fairseq_capsagg.tools.flags import flags_table
from fairseq_capsagg.tools.markdown_block import find_block
from helpers import ROOT

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: A path into the repository's code as the pages write it (``tests/unit/test_docs.py``, ``examples/table1.py``).
REPOSITORY_PATH = re.compile(r"\b(?:fairseq_capsagg|tests|examples|benchmarks|data)/[\w./-]*\.(?:py|sh)\b")
#: docs/extending.md's worked example: the file a reader adds (tests/integration/test_extending.py writes it to a copy).
WORKED_EXAMPLE = "fairseq_capsagg/aggregators/layer_mean.py"


def block(name: str, text: str = None) -> str:
    match = find_block(README.read_text(encoding="utf-8") if text is None else text, name)
    assert match, f"no {name} block"
    return match.group(2)


def cited_row(source: str):
    """``file.json`` ``row-name`` (a table's row) or ``file.json`` ``row N`` (the main job's N-th row); ``file``
    relative to docs/results (``streams/peers-cpu.json``)."""
    file, row = re.fullmatch(r"`((?:[\w.-]+/)*[\w.-]+\.json)` `([^`]+)`", source.strip()).groups()
    payload = json.loads((ROOT / "docs" / "results" / file).read_text())
    numbered = re.fullmatch(r"row (\d+)", row)
    return payload["rows"][int(numbered.group(1)) - 1] if numbered else payload["results"][row]


def number(cell: str):
    cell = cell.strip().replace("−", "-")
    return None if cell == "–" else float(cell)


def check_results_table(text: str) -> int:
    """Asserts that every row of the README's results table says what the JSON it cites says;
    returns the number of rows."""
    lines = [line for line in block("results", text).splitlines()
             if line.startswith("| ") and not line.startswith("| protocol")]
    for line in lines:
        protocol, system, bleu, delta, p, source = [cell.strip() for cell in line.strip().strip("|").split("|")]
        row = cited_row(source)
        assert number(bleu) == pytest.approx(row["bleu"], abs=0.005), (system, protocol)
        expected_delta = row.get("delta_bleu")
        assert (number(delta) is None) == (expected_delta is None), (system, protocol)
        if expected_delta is not None:
            assert number(delta) == pytest.approx(expected_delta, abs=0.005), (system, protocol)
            assert number(p) == pytest.approx(row["bootstrap_p"], abs=0.0005), (system, protocol)
    return len(lines)


def test_the_results_table_reads_what_its_json_says():
    assert check_results_table(README.read_text(encoding="utf-8")) >= 20


@pytest.mark.parametrize("old,new", [("| 10.38 | +2.96 | 0.001 |", "| 10.38 | +2.69 | 0.001 |"),
                                     ("| 9.96 | −0.41 | 0.012 |", "| 9.96 | −0.41 | 0.120 |"),
                                     ("`scratch-emrouting-s2`", "`scratch-emrouting-s1`")])
def test_a_number_its_json_does_not_say_is_caught(old, new):
    text = README.read_text(encoding="utf-8")
    assert old in text
    with pytest.raises(AssertionError):
        check_results_table(text.replace(old, new))


def test_the_by_method_table_is_what_the_published_json_say():
    """Regenerate with ``python -m fairseq_capsagg.pipeline.by_method --write README.md`` after a row publishes."""
    assert block("by-method") == by_method_table()


def test_the_replication_table_is_what_the_two_runs_published():
    """Regenerate with ``python -m fairseq_capsagg.pipeline.replication --write docs/results.md``."""
    assert block("replication", (ROOT / "docs" / "results.md").read_text(encoding="utf-8")) == replication_table()


def test_the_flags_table_is_the_parsers():
    assert block("flags") == flags_table()


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_local_links_point_at_files(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    missing = [link for link in links if not link.startswith("http") and not (page.parent / link).exists()]
    assert not missing, missing


@pytest.mark.parametrize("page", [*DOCS, *sorted((ROOT / "tests" / "data").rglob("README.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_files_a_page_names_exist(page):
    """The pages name the tests and modules behind what they say; a moved file must not leave them pointing
    nowhere (the split into tests/unit and tests/integration once did)."""
    named = set(REPOSITORY_PATH.findall(page.read_text(encoding="utf-8"))) - {WORKED_EXAMPLE}
    missing = [path for path in sorted(named) if not (ROOT / path).exists()]
    assert not missing, missing
