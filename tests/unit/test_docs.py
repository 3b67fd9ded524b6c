"""The README and docs/: every row of docs/results.md's results table reads what the JSON it cites says, the
generated tables (``make tables``) are what the published JSON say, the flags table is the parser's, and every local
link and every file of the repository they name exists."""

import functools
import json
import re
import shlex
import shutil

import pytest

from fairseq_capsagg.pipeline.reports import summary
from fairseq_capsagg.tools.flags import flags_table
from fairseq_capsagg.tools.markdown_block import find_block, read_block
from helpers import ROOT

README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "results.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: A path into the repository's code as the pages write it (``tests/unit/test_docs.py``, ``examples/table1.py``).
REPOSITORY_PATH = re.compile(r"\b(?:fairseq_capsagg|tests|examples|benchmarks|data)/[\w./-]*\.(?:py|sh)\b")
#: docs/extending.md's worked example: the file a reader adds (tests/integration/test_extending.py writes it to a copy).
WORKED_EXAMPLE = "fairseq_capsagg/aggregators/methods/layer_mean.py"


def block(name: str, text: str = None) -> str:
    match = find_block(RESULTS.read_text(encoding="utf-8") if text is None else text, name)
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
    assert check_results_table(RESULTS.read_text(encoding="utf-8")) >= 20


@pytest.mark.parametrize("old,new", [("| 10.38 | +2.96 | 0.001 |", "| 10.38 | +2.69 | 0.001 |"),
                                     ("| 9.96 | −0.41 | 0.012 |", "| 9.96 | −0.41 | 0.120 |"),
                                     ("`scratch-emrouting-s2`", "`scratch-emrouting-s1`")])
def test_a_number_its_json_does_not_say_is_caught(old, new):
    text = RESULTS.read_text(encoding="utf-8")
    assert old in text
    with pytest.raises(AssertionError):
        check_results_table(text.replace(old, new))


def summary_commands():
    """The ``make tables`` recipe's commands: the summary's arguments, the published JSONs among them."""
    recipe = (ROOT / "Makefile").read_text().split("\ntables:")[1].split("\n\n")[0]
    commands = [line.split("reports.summary", 1)[1] for line in recipe.splitlines() if "reports.summary" in line]
    return [shlex.split(command.replace("$(R)", "docs/results")) for command in commands]


@pytest.mark.parametrize("argv", summary_commands(), ids=lambda argv: argv[0])
def test_the_generated_tables_are_what_the_published_json_say(argv, tmp_path, monkeypatch):
    """After a row publishes, ``make tables`` regenerates them."""
    page = argv[argv.index("--write") + 1]
    shutil.copy2(ROOT / page, tmp_path / "page.md")
    argv[argv.index("--write") + 1] = str(tmp_path / "page.md")
    monkeypatch.chdir(ROOT)
    summary.cli_main(argv)
    assert read_block(ROOT / page, argv[0]) == read_block(tmp_path / "page.md", argv[0])


def test_the_flags_table_is_the_parsers():
    assert block("flags", README.read_text(encoding="utf-8")) == flags_table()


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_local_links_point_at_files(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
    missing = [link for link in links if not link.startswith("http") and not (page.parent / link).exists()]
    assert not missing, missing


@functools.lru_cache(maxsize=None)
def heading_anchors(page) -> frozenset:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, each space a hyphen."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return frozenset(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings)


def missing_anchors(page, text: str) -> list:
    """The links of ``text`` (``page``'s) to a section (``results.md#the-main-job-make-demo``) that no heading of
    the page they name has."""
    links = re.findall(r"\]\(([^)\s]*)#([^)\s]+)\)", text)
    return [f"{target}#{anchor}" for target, anchor in links if not target.startswith("http")
            and anchor not in heading_anchors((page.parent / target).resolve() if target else page)]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_local_links_point_at_headings(page):
    assert not missing_anchors(page, page.read_text(encoding="utf-8"))


def test_a_link_to_a_section_that_is_not_there_is_caught():
    text = README.read_text(encoding="utf-8")
    assert "results.md#the-main-job-make-demo)" in text
    assert missing_anchors(README, text.replace("results.md#the-main-job-make-demo)", "results.md#the-main-job)")) \
        == ["docs/results.md#the-main-job"]


@pytest.mark.parametrize("page", [*DOCS, *sorted((ROOT / "tests" / "data").rglob("README.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_files_a_page_names_exist(page):
    """The pages name the tests and modules behind what they say; a moved file must not leave them pointing
    nowhere (the split into tests/unit and tests/integration once did)."""
    named = set(REPOSITORY_PATH.findall(page.read_text(encoding="utf-8"))) - {WORKED_EXAMPLE}
    missing = [path for path in sorted(named) if not (ROOT / path).exists()]
    assert not missing, missing


#: docs/results.md's kernel table: each label's system, and the published run it reads.
KERNEL_ROWS = {"Transformer": ("baseline", "kernels-cpu"), "linear combination": ("linagg", "kernels-cpu"),
               "dynamic combination": ("dyncomb", "kernels-cpu"),
               **{f"{label}, {kind}": (system, run)
                  for label, system in (("dynamic routing", "dynrouting"), ("EM routing", "emrouting"))
                  for kind, run in (("fused (default on CUDA)", "kernels-cpu"), ("eager", "kernels-cpu-eager"))},
               "DWA": ("dwa", "kernels-cpu"),
               **{f"{label}, {kind}": (system, run)
                  for label, system in (("attention over depth", "depthattn"), ("MUDD", "mudd"))
                  for kind, run in (("fused (default on CUDA)", "kernels-cpu"), ("eager", "kernels-cpu-eager"))},
               "DLCL": ("dlcl", "kernels-cpu"),
               **{f"{label}, {kind}": (system, run)
                  for label, system in (("hyper-connections", "hc"), ("mHC", "mhc"))
                  for kind, run in (("fused (default on CUDA)", "kernels-cpu"), ("eager", "kernels-cpu-eager"))}}


def table_rows(heading: str):
    """The rows of the tables under docs/results.md's ``### heading``, their header rows left out."""
    text = RESULTS.read_text(encoding="utf-8").split(f"### {heading}")[1].split("###")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| system")]


def published_row(name: str, system: str) -> dict:
    published = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())["rows"]
    return next(r for r in published if r["system"] == system and r["shape"] == "small")


def assert_per_step_cells(label: str, row: dict, cells: dict) -> None:
    """Each (value, ratio) cell pair of a per-step table against the published row: kernels as counted, traffic in
    GiB, step memory in MiB, ratios to two decimals."""
    formats = {"train_kernels": lambda v: f"{v:,}", "decode_kernels": lambda v: f"{v:,}",
               "train_bytes_moved": lambda v: f"{v / 2**30:.2f} GiB",
               "train_step_peak_bytes": lambda v: f"{v / 2**20:.1f} MiB"}
    for key, (value, ratio) in cells.items():
        assert value == formats[key](row[key]), (label, key)
        assert float(ratio) == pytest.approx(row[key + "_ratio"], abs=0.005), (label, key)


def test_the_kernel_counts_are_what_the_benchmark_published():
    rows = table_rows("Kernels per step")
    assert [row[0] for row in rows] == list(KERNEL_ROWS)
    for label, *cells in rows:
        system, name = KERNEL_ROWS[label]
        keys = ("train_kernels", "decode_kernels", "train_bytes_moved", "train_step_peak_bytes")
        assert_per_step_cells(label, published_row(name, system), dict(zip(keys, zip(cells[::2], cells[1::2]))))


#: docs/results.md's bf16 table: each label's system in the bf16 run.
BF16_ROWS = {"Transformer": "baseline", "linear combination": "linagg", "dynamic combination": "dyncomb",
             "dynamic routing": "dynrouting", "EM routing": "emrouting", "DWA": "dwa",
             "attention over depth": "depthattn", "MUDD": "mudd", "DLCL": "dlcl", "hyper-connections": "hc",
             "mHC": "mhc"}


def test_the_bf16_counts_are_what_the_benchmark_published():
    rows = table_rows("In bf16")
    assert [row[0] for row in rows] == list(BF16_ROWS)
    for label, *cells in rows:
        keys = ("train_kernels", "train_bytes_moved", "train_step_peak_bytes")
        assert_per_step_cells(label, published_row("kernels-cpu-bf16", BF16_ROWS[label]),
                              dict(zip(keys, zip(cells[::2], cells[1::2]))))


def headline_bullets() -> str:
    """The README's bullets under the results at a glance."""
    text = README.read_text(encoding="utf-8")
    return text[text.index("<!-- glance:end -->"):text.index("## Running the experiments")]


def published(name: str):
    return json.loads((ROOT / "docs" / "results" / name).read_text())


def test_the_headline_bullets_quote_the_published_numbers():
    """Every number of the bullets that sums up a published table is what that table says."""
    bullets = re.sub(r"\s+", " ", headline_bullets())
    equivalence = published("compute-equivalence.json")
    last = {name: points[-1] for name, points in equivalence["compute_equivalence"]["rows"].items()}

    def ratio(name: str, key: str = "updates_ratio") -> float:
        return round(sum(last[name][key]) / 2, 2)

    seeded = {system: [name for name, result in equivalence["results"].items() if result["system"] == system]
              for system in ("dyncomb", "hc", "mudd")}
    for name in sum(seeded.values(), []) + ["scratch-dwa-s1", "scratch-dlcl-s1", "scratch-emrouting-s1"]:
        assert f"{ratio(name):.2f}x" in bullets, name
    systems = equivalence["compute_equivalence"]["systems"]
    for system, whose in (("hc", "the hyper-connections'"), ("dyncomb", "the dynamic combination's"),
                          ("mudd", "MUDD's")):
        assert f"{systems[system][-1]['mean']:.2f}x {whose}" in bullets, system
    lasting = [ratio(name, "seconds_ratio") for name in seeded["dyncomb"]]
    assert f"{min(lasting):.2f}-{max(lasting):.2f}x in seconds on 2 CPU cores" in bullets
    seed_dependent = [ratio(name, "seconds_ratio") for name in seeded["hc"] + seeded["mudd"]]
    assert f"{min(seed_dependent):.2f}-{max(seed_dependent):.2f}x in seconds)" in bullets
    slow = [ratio(f"scratch-{s}-s1", "seconds_ratio") for s in ("dwa", "dlcl")]
    assert f"{min(slow):.2f}-{max(slow):.2f}x in seconds" in bullets
    dense = [result["bleu"] for result in equivalence["results"].values()
             if result["system"] in ("hc", "dyncomb", "mudd", "dwa", "dlcl")]
    assert f"{equivalence['results']['scratch-emrouting-s1']['bleu']:.1f} BLEU" in bullets
    assert f"{min(dense):.1f}-{max(dense):.1f}" in bullets
    band = equivalence["compute_equivalence"]["seed_band"]
    assert f"three seeds' {summary.span(band[max(band, key=int)])}x" in bullets
    seeds = [equivalence["results"][f"scratch-baseline-s{seed}"]["bleu"] for seed in (2, 3)]
    assert f"seeds {min(seeds):.2f}-{max(seeds):.2f}" in bullets
    for system, name in (("hc", "hyper-connections"), ("mudd", "MUDD")):
        bleu = [equivalence["results"][row]["bleu"] for row in seeded[system]]
        assert f"{name} {min(bleu):.2f}-{max(bleu):.2f}" in bullets, system
    continued = [r["average"]["delta_bleu"] for name, r in published("converged-cpu.json")["results"].items()
                 if name.startswith("continued-") and name != "continued-baseline" and "delta_bleu" in r["average"]
                 and not name.endswith("-s2")]
    assert f"{min(continued):+.2f} to {max(continued):+.2f} BLEU".replace("-", "−") in bullets
    em = [published("table1-cpu.json")["results"][f"scratch-emrouting-s{seed}"]["delta_bleu"] for seed in (1, 2)]
    assert f"loses {-max(em):.1f}-{-min(em):.1f}" in bullets
    capsules = published("dynrouting-capsules-cpu.json")["results"]
    routed, unrouted = (-capsules[f"scratch-dynrouting-n{n}-s1"]["delta_bleu"] for n in (2, 1))
    assert f"dynamic routing {routed:.1f} at its N = 2 capsules ({unrouted:.1f} at N = 1" in bullets


def documented_commands(program: str):
    """The README's commands of ``program`` under "Running the experiments", continuation lines joined, comments
    dropped, each as its arguments."""
    text = README.read_text(encoding="utf-8")
    commands = re.search(r"```bash\n(.*?)```", text[text.index("## Running the experiments"):], re.S).group(1)
    joined = re.sub(r"\\\n\s*", " ", commands)
    for line in joined.splitlines():
        argv = shlex.split(line.split("#")[0])
        if argv[:1] == [program]:
            yield argv[1:]


def test_the_documented_table_commands_parse(monkeypatch):
    """Every ``capsagg-table1`` command the README shows is one the driver takes as written, from the repository's
    root (the published files it names are read): its flags, its table's rows and the files it names."""
    from fairseq_capsagg.pipeline.drivers import table1

    monkeypatch.chdir(ROOT)
    commands = list(documented_commands("capsagg-table1"))
    assert any("compute-equivalence" in argv for argv in commands)
    for argv in commands:
        args = table1.parse_args(argv)
        assert set(args.rows) <= {row.name for row in table1.rows_of(args)}, argv
