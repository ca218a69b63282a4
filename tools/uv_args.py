"""Print, one per line, the `uv pip install` options that choose the same packages as this machine's pip would.

bootstrap.sh installs etlab's Python packages with uv (a third of pip's time, bytecode included), but uv does not
read pip's configuration, and on a machine that sets one (find-links to a CPU-only torch wheel, a constraints file,
mirrors) ignoring it would install other packages. So the settings that choose packages are read from `pip config
list` (files and PIP_* variables, as pip resolves them: the environment over [install] over [global]) and handed over.
pip treats all indexes alike, so uv is told to as well. Standard library only: it runs before anything is installed.

    python tools/uv_args.py PYTHON
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's key -> uv's option; the values of these may list several, separated by whitespace
CHOOSING = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
RANK = {"global": 0, "install": 1, ":env:": 2}  # pip's precedence, lowest first


def pip_settings(python: str) -> dict[str, str]:
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True).stdout
    chosen: dict[str, tuple[int, str]] = {}
    for line in listed.splitlines():
        name, sep, quoted = line.partition("=")
        section, dot, key = name.rpartition(".")
        if not sep or not dot or section not in RANK:
            continue
        value = ast.literal_eval(quoted)  # pip prints repr()
        if key not in chosen or RANK[section] >= chosen[key][0]:
            chosen[key] = (RANK[section], value)
    return {key: value for key, (_, value) in chosen.items()}


def uv_args(settings: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for key, option in CHOOSING.items():
        for value in settings.get(key, "").split():
            args += [option, value]
    return args


if __name__ == "__main__":
    print("\n".join(uv_args(pip_settings(sys.argv[1]))))
