"""`fab` never exits 70 ("internal error", etlab's own bug) on user or board input anywhere in the suite.

Every `fab` the tests start inherits ETLAB_INTERNAL_ERROR_LOG; `commands.handling.handle_errors` appends one line
there for each exit 70. A session that collected any fails, and the report names the task, its arguments and the
traceback, whichever test started it.

Under pytest-xdist the controller creates the log before it starts the workers, which inherit it: every worker's
`fab`s append to the one file, and the controller, which alone decides the run's exit status, reads it at the end.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

_WORKER = "PYTEST_XDIST_WORKER" in os.environ  # an xdist worker: the controller made the log and judges it
if _WORKER and os.environ.get("ETLAB_INTERNAL_ERROR_LOG"):
    _LOG = Path(os.environ["ETLAB_INTERNAL_ERROR_LOG"])
else:
    _LOG = Path(tempfile.mkdtemp(prefix="etlab-internal-errors-")) / "exit70.jsonl"
    os.environ["ETLAB_INTERNAL_ERROR_LOG"] = str(_LOG)  # set at import, before any test or worker starts


def internal_errors() -> list[dict[str, Any]]:
    if not _LOG.exists():
        return []
    return [json.loads(line) for line in _LOG.read_text(encoding="utf-8").splitlines() if line.strip()]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    found = [] if _WORKER else internal_errors()
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.section(f"fab exited 70 (internal error) {len(found)} time(s)", sep="=", red=True)
        for entry in found:
            reporter.write_line(f"{entry['task']}: {' '.join(map(str, entry['argv']))}")
            reporter.write_line(str(entry["detail"]))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
