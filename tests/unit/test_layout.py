"""The package's rooms: each imports only from the rooms before it (docs in fairseq_capsagg/__init__.py
and the README's layout table), so a library never reaches up into a command that uses it."""

import ast
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

import fairseq_capsagg

PACKAGE = Path(fairseq_capsagg.__file__).parent
#: The rooms in the order they may import each other: a room imports only from rooms before it.
ROOMS = ["aggregators", "models", "patches", "tools", "analysis", "pipeline"]
#: Top-level modules that every room may use and that import no room themselves.
LEAVES = ["input_repair", "user_dir"]


def imported_modules(path: Path) -> List[Tuple[int, str]]:
    """(line, absolute module) of every import of the plugin's own modules in ``path``."""
    package = ["fairseq_capsagg", *path.relative_to(PACKAGE).parent.parts]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] if node.module else [f"{module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] == "fairseq_capsagg"]


def room_of(module: str) -> str:
    """The room (or leaf) of a module; "package" for the package itself or a name its ``__init__`` defines (which
    imports the rooms: importing it from a room would run back up)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS + LEAVES else "package"


def modules() -> List[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != PACKAGE / "__init__.py")


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_room_after_its_own(path):
    own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    assert own in ROOMS or own in LEAVES, f"{own} is neither a room nor a leaf"
    allowed = {*LEAVES} | set(ROOMS[:ROOMS.index(own) + 1] if own in ROOMS else [])
    upward = [(line, module) for line, module in imported_modules(path) if room_of(module) not in allowed]
    assert not upward, f"{path.relative_to(PACKAGE)} imports from a later room: {upward}"


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    tool = PACKAGE / "tools" / "hub.py"
    assert ("fairseq_capsagg.input_repair" in {m for _, m in imported_modules(tool)})
    fake = tmp_path / "fairseq_capsagg" / "tools" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..analysis import scoring\nfrom . import hub\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "fairseq_capsagg")
    with pytest.raises(AssertionError, match="imports from a later room"):
        test_no_module_imports_a_room_after_its_own(fake)
    fake.write_text("from .. import USER_DIR\n")  # the package's __init__, which imports every room
    with pytest.raises(AssertionError, match="imports from a later room"):
        test_no_module_imports_a_room_after_its_own(fake)


#: Files that may be larger than a run-state guard allows: the bundled corpora and the test fixtures.
LARGE_FILES_ALLOWED = ("data/", "tests/data/")


def test_no_run_state_is_tracked():
    """Checkpoints, archives and work directories never enter git: no tracked file outside the corpora and the
    test fixtures is larger than 2 MB."""
    root = PACKAGE.parent
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    large = [path for path in listed.stdout.split("\0") if path and not path.startswith(LARGE_FILES_ALLOWED)
             and (root / path).is_file() and (root / path).stat().st_size > 2 * 1024 * 1024]
    assert not large, f"tracked files over 2 MB (run state belongs in runs/, which git ignores): {large}"


#: Inside the pipeline: the stages' library, then the drivers' reports, then the drivers, each importing only
#: from those before it.
PIPELINE_FLOORS = ["", "reports", "drivers"]


@pytest.mark.parametrize("path", sorted((PACKAGE / "pipeline").rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_pipelines_library_reaches_no_report_and_no_report_a_driver(path):
    parts = path.relative_to(PACKAGE / "pipeline").parts
    own = parts[0] if len(parts) > 1 else ""
    above = PIPELINE_FLOORS[PIPELINE_FLOORS.index(own) + 1:]
    upward = [(line, module) for line, module in imported_modules(path)
              if any(module.startswith(f"fairseq_capsagg.pipeline.{floor}") for floor in above)]
    assert not upward, f"{path.relative_to(PACKAGE)} imports from a floor above its own: {upward}"


AGGREGATORS = PACKAGE / "aggregators"
#: The modules on the aggregators' floor (beside the package's ``__init__``), which import no room of it.
AGGREGATOR_FLOOR = sorted(p.stem for p in AGGREGATORS.glob("*.py") if p.stem != "__init__")
#: What each room of the aggregators, and the floor, may import from the aggregators: methods use operators, which
#: find their kernels by name (:mod:`~fairseq_capsagg.aggregators.ops.dispatch`), and kernels import only kernels
#: and the shared numerics.
AGGREGATOR_ROOMS = {"kernels": {"kernels", "numerics"}, "ops": {"ops", "numerics", "layer_history"},
                    "methods": {"methods", "ops", *AGGREGATOR_FLOOR}, "floor": set(AGGREGATOR_FLOOR)}


def aggregator_room(module: str) -> str:
    """methods, ops, kernels or a floor module's name (the aggregators' package itself: ``__init__``)."""
    parts = module.split(".")[2:]
    return parts[0] if parts else "__init__"


@pytest.mark.parametrize("path", sorted(p for p in AGGREGATORS.rglob("*.py") if p.name != "__init__.py"),
                         ids=lambda p: str(p.relative_to(AGGREGATORS)))
def test_kernels_import_nothing_above_them_and_operators_no_method(path):
    parts = path.relative_to(AGGREGATORS).parts
    own = parts[0] if len(parts) > 1 else "floor"
    imported = [(line, module) for line, module in imported_modules(path)
                if module.startswith("fairseq_capsagg.aggregators")]
    upward = [(line, module) for line, module in imported if aggregator_room(module) not in AGGREGATOR_ROOMS[own]]
    assert not upward, f"aggregators/{path.relative_to(AGGREGATORS)} imports above its room: {upward}"


def test_each_kernel_module_is_named_after_its_operator():
    """One name per operator from the operator to its kernels: every kernel module but the shared one has an
    operator namesake, which the dispatch finds it by."""
    kernels = {p.stem for p in (AGGREGATORS / "kernels").glob("*.py")} - {"__init__", "common"}
    assert kernels and kernels <= {p.stem for p in (AGGREGATORS / "ops").glob("*.py")}


def test_the_check_sees_a_kernel_importing_an_operator(tmp_path, monkeypatch):
    fake = tmp_path / "fairseq_capsagg" / "aggregators" / "kernels" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from ..numerics import RMS_EPS\nfrom ..ops.em_route import em_route\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", tmp_path / "fairseq_capsagg")
    monkeypatch.setattr(__import__(__name__), "AGGREGATORS", tmp_path / "fairseq_capsagg" / "aggregators")
    with pytest.raises(AssertionError, match="imports above its room"):
        test_kernels_import_nothing_above_them_and_operators_no_method(fake)
