"""tools/uv_args.py: bootstrap.sh's uv is handed the settings that choose packages, read from pip itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from orchestrator.paths import PROJECT_ROOT


def test_uv_gets_what_pip_would_choose_packages_by(tmp_path: Path) -> None:
    # A machine's pip configuration: a file (PIP_CONFIG_FILE: read after the machine's own), an [install] section
    # over [global], and a PIP_* variable over both; keys that do not choose packages are left to uv's defaults.
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nextra-index-url = file:///mirror/a file:///mirror/b\nfind-links = /wheels/file\n"
        "constraint = /global.txt\ntimeout = 60\n[install]\nconstraint = /install.txt\n"
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": str(conf),
           "PIP_FIND_LINKS": "/wheels/env"}  # fmt: skip
    done = subprocess.run([sys.executable, PROJECT_ROOT / "tools" / "uv_args.py", sys.executable],
                          capture_output=True, text=True, env=env, check=True)  # fmt: skip
    assert done.stdout.split("\n")[:-1] == [
        "--index-strategy", "unsafe-best-match",  # pip reads every index alike
        "--extra-index-url", "file:///mirror/a", "--extra-index-url", "file:///mirror/b",
        "--find-links", "/wheels/env",
        "--constraint", "/install.txt",
    ]  # fmt: skip
