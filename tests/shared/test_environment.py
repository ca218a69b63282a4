"""README's list of `ETLAB_*` variables is the list of those the code reads (so neither drifts from the other)."""

from __future__ import annotations

import re

from orchestrator.paths import PROJECT_ROOT

# How the code reads a variable: os.environ.get("X"...), os.environ["X"], os.getenv("X"), paths._root_from_env("X", ...)
READS = re.compile(r"""(?:environ\.get|environ\[|getenv|_root_from_env)\(?\s*["'](ETLAB_[A-Z0-9_]+)["']""")


def read_by_the_code() -> set[str]:
    files = [*(PROJECT_ROOT / "orchestrator").rglob("*.py"), *(PROJECT_ROOT / "tools").glob("*.py"),
             PROJECT_ROOT / "tasks.py"]  # fmt: skip
    return {name for path in files for name in READS.findall(path.read_text(encoding="utf-8"))}


def test_the_readme_lists_every_etlab_variable_the_code_reads() -> None:
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(ETLAB_[A-Z0-9_]+)` \|", section, flags=re.MULTILINE))
    code = read_by_the_code()
    assert {"ETLAB_ARTIFACTS", "ETLAB_RESULTS", "ETLAB_STATE", "ETLAB_INVENTORY"} <= code, "the pattern finds reads"
    assert listed == code, f"README only: {sorted(listed - code)}; code only: {sorted(code - listed)}"
    for row in re.findall(r"^\| `ETLAB_[A-Z0-9_]+` \|.*$", section, flags=re.MULTILINE):
        assert row.count("|") == 4 and row.rstrip("| ").split("|")[-1].strip(), f"a default in every row: {row}"
