"""The tests mirror the packages (tests/README.md): every test module sits in a folder named for the package it tests
(or one of the documented extra folders), every folder is a package, and no test file is over 500 lines. No module of
orchestrator/ or board/ is over 600 lines, and docs/DESIGN.md's map names every module."""

from __future__ import annotations

from pathlib import Path

from orchestrator.paths import PROJECT_ROOT

TESTS = Path(__file__).parent
MAX_LINES = 500
MAX_MODULE_LINES = 600  # a module longer than this holds more than one concept: split it along its seams (issue 35)
# Folders that are not an orchestrator package: the board side, shared top-level modules, whole chains, fixtures.
EXTRA_FOLDERS = {"board", "shared", "e2e", "plugins", "data"}
TOP_LEVEL_TESTS = {"test_layers.py", "test_layout.py"}  # meta tests of the layout itself


def orchestrator_packages() -> set[str]:
    return {p.parent.name for p in (PROJECT_ROOT / "orchestrator").glob("*/__init__.py")}


def test_every_test_module_sits_in_a_folder_named_for_a_package() -> None:
    allowed = orchestrator_packages() | EXTRA_FOLDERS - {"plugins", "data"}
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        relative = path.relative_to(TESTS)
        if len(relative.parts) == 1:
            if relative.name not in TOP_LEVEL_TESTS:
                misplaced.append(str(relative))
        elif len(relative.parts) != 2 or relative.parts[0] not in allowed:
            misplaced.append(str(relative))
    assert not misplaced, f"move these under tests/<package>/ (see tests/README.md): {misplaced}"


def test_every_test_folder_is_a_package() -> None:
    """Same-named modules in two folders would clash without an __init__.py."""
    folders = {p.parent for p in TESTS.rglob("*.py") if p.relative_to(TESTS).parts[0] != "data"}
    assert not [str(f.relative_to(PROJECT_ROOT)) for f in folders if not (f / "__init__.py").exists()]


def test_the_documented_folders_exist_and_no_other() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
    assert folders <= orchestrator_packages() | EXTRA_FOLDERS, folders - orchestrator_packages() - EXTRA_FOLDERS
    readme = (TESTS / "README.md").read_text()
    assert all(f"tests/{folder}/" in readme for folder in folders), "tests/README.md names every folder"


def test_no_test_file_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if path.relative_to(TESTS).parts[0] != "data" and (lines := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"split these by topic (shared helpers in tests/plugins/ or a helper module beside them): {long}"


def test_the_design_map_names_every_module() -> None:
    """docs/DESIGN.md's map is where a newcomer finds a module: a module it does not name is one nobody finds."""
    design = (PROJECT_ROOT / "docs" / "DESIGN.md").read_text()
    modules = sorted((PROJECT_ROOT / "orchestrator").rglob("*.py"))
    missing = [str(m.relative_to(PROJECT_ROOT)) for m in modules if m.name != "__init__.py" and m.name not in design]
    assert not missing, f"name these in docs/DESIGN.md's map: {missing}"


def test_no_module_is_over_600_lines() -> None:
    """orchestrator/ and board/ (the agent copied to a board): a module a newcomer can read whole. Native build trees
    (board/runner/build/, git-ignored) are not ours."""
    native_build = PROJECT_ROOT / "board" / "runner" / "build"
    modules = [
        path
        for package in ("orchestrator", "board")
        for path in sorted((PROJECT_ROOT / package).rglob("*.py"))
        if not path.is_relative_to(native_build)
    ]
    assert len(modules) > 100, "the walk found the packages"  # a moved root would pass with nothing checked
    long = {
        str(path.relative_to(PROJECT_ROOT)): lines
        for path in modules
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these along their seams, one concept per module (docs/DESIGN.md's map): {long}"


def test_records_are_written_and_read_by_records_py_only() -> None:
    """One serialization mechanism (issue 35): a record is a typed dataclass that orchestrator/records.py writes and
    reads back, never a hand-written to_dict/from_dict pair. The one to_dict left is a ModelSpec's recorded form
    (its identity: the cache key and the sidecar's `spec`), read back by lowered.spec_from_record."""
    import re

    allowed = {("orchestrator/lowering/spec.py", "to_dict")}
    found = {
        (str(path.relative_to(PROJECT_ROOT)), match[1])
        for path in (PROJECT_ROOT / "orchestrator").rglob("*.py")
        for match in re.finditer(r"^\s+def (to_dict|from_dict)\(", path.read_text(), re.M)
    }
    assert found <= allowed, f"write these as records (orchestrator/records.py): {sorted(found - allowed)}"
