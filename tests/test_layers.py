"""The package layers import strictly downward (docs/DESIGN.md): a change finds its room in one guess."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from orchestrator.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "orchestrator"
# Top to bottom. A module may import its own layer and any layer below it, never one above. `testing` holds
# the fake boards that tests and bench/ share. `servers` (local web servers and their HTTP guard) sits under the
# commands that start them and over everything they may show (runs, programs, the nightly's history). Data flows
# spec -> artifacts -> board -> bundle -> analysis, so results sits above lowering; `programs` (reading a .pte) is
# below both, as both read programs.
LAYERS = (
    "testing", "commands", "servers", "lab", "advice", "deploy", "transport", "results", "lowering", "programs",
    "boards", "shared",
)  # fmt: skip


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else "shared"


def _is_module(name: str) -> bool:
    path = PROJECT_ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every orchestrator module `path` imports, with its line. `from pkg import name` imports the module `pkg.name`
    when that is a module (`from orchestrator.commands import options`), else the module `pkg` (a name in it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("orchestrator"):
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [(node.lineno, name if _is_module(name) else node.module) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("orchestrator")]
    return found


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts)


def test_every_import_goes_down() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _layer(_module_name(path))
        for line, target in _imports(path):
            there = _layer(target)
            if there == here:
                continue
            if LAYERS.index(there) < LAYERS.index(here):
                upward.append(f"{path.relative_to(PROJECT_ROOT)}:{line}: {here} imports {target} ({there})")
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_import_cycles_between_modules() -> None:
    modules = {_module_name(p).removesuffix(".__init__"): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {t for _, t in _imports(path) if t in modules and t != name} for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_an_import_of_a_module_from_its_package_is_an_edge_to_that_module() -> None:
    """`from orchestrator.commands import options` imports the module options, not the package: an edge the cycle
    test must see (it missed advise -> common -> options -> advise when this was read as the package)."""
    imported = {target for _, target in _imports(PACKAGE / "commands" / "common.py")}
    assert {"orchestrator.commands.options", "orchestrator.config", "orchestrator.boards.labgrid"} <= imported
    assert "orchestrator.commands" not in imported and "orchestrator" not in imported


def test_layer_table_names_every_package() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(LAYERS) - {"shared"}


def test_only_commands_render_tables() -> None:
    """Domain modules return data; the command layer draws it (console.table and console.details)."""
    drawing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "commands" or path.name == "console.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "console.table(" in line or "console.details(" in line:
                drawing.append(f"{path.relative_to(PROJECT_ROOT)}:{number}")
    assert not drawing, "tables drawn outside orchestrator/commands/: " + ", ".join(drawing)


# Packages whose import costs seconds: a module importing one at its top is imported inside the functions that need
# it, and says nothing more.
HEAVY_PACKAGES = frozenset({"torch", "torchao", "transformers", "executorch", "matplotlib", "scipy"})


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            if node.module == "orchestrator":
                names.update(f"orchestrator.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def _heavy_modules(modules: dict[str, Path]) -> set[str]:
    """The orchestrator modules whose import (directly or through other modules' top-level imports) loads a heavy
    package."""
    imports = {name: _top_level_imports(path) for name, path in modules.items()}
    heavy = {name for name, found in imports.items() if any(n.split(".")[0] in HEAVY_PACKAGES for n in found)}
    while True:
        more = {name for name, found in imports.items() if name not in heavy and found & heavy}
        if not more:
            return heavy
        heavy |= more


def test_imports_inside_functions_say_why() -> None:
    """An orchestrator module imported inside a function hides an edge from readers and tools: it is either a
    module that pulls a heavy package (torch...), or its import group carries a comment saying why it is there."""
    modules = {_module_name(p).removesuffix(".__init__"): p for p in PACKAGE.rglob("*.py")}
    heavy = _heavy_modules(modules)
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        tree = ast.parse("\n".join(lines))
        nested = {
            node
            for function in ast.walk(tree)
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(function)
            if isinstance(node, (ast.Import, ast.ImportFrom))
        }
        for node in sorted(nested, key=lambda n: n.lineno):
            if isinstance(
                node, ast.ImportFrom
            ):  # `from orchestrator.lowering.sources.builders import models` imports a module
                names = [f"{node.module}.{alias.name}" for alias in node.names]
                targets = [name if name in modules else str(node.module) for name in names]
            else:
                targets = [alias.name for alias in node.names]
            ours = [t for t in targets if t.startswith("orchestrator")]
            if not ours or all(t in heavy for t in ours):
                continue
            # The comment: on the statement's own lines, or above the group of imports it belongs to.
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
                first -= 1
            group = lines[first : node.end_lineno]
            if "#" in "".join(group) or (first > 0 and lines[first - 1].strip().startswith("#")):
                continue
            unexplained.append(f"{path.relative_to(PROJECT_ROOT)}:{node.lineno}: {', '.join(ours)}")
    assert not unexplained, "imports inside functions without a reason comment:\n" + "\n".join(unexplained)


# Options of `fab` are named by the command layer only; below it an error names what went wrong, not a flag (the
# command layer adds the hint: commands/common.py). The runner's own options (`--version`) are not etlab's.
_OPTION = re.compile(r"(?<![\w-])--(?!version\b|probe-)[a-z][a-z-]+")


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_errors_below_the_command_layer_name_no_option() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _layer(_module_name(path)) in ("commands", "testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            texts: list[str] = []
            if isinstance(node, ast.Raise) and node.exc is not None:
                texts = _strings(node.exc)
            elif isinstance(node, ast.keyword) and node.arg == "hint":
                texts = _strings(node.value)
            for text in texts:
                if _OPTION.search(text):
                    found.append(f"{path.relative_to(PROJECT_ROOT)}:{getattr(node, 'lineno', '?')}: {text!r}")
    assert not found, "errors that name a fab option below the command layer:\n" + "\n".join(found)
