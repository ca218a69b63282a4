"""Drive the board agent as a real subprocess (`python -m etlab_agent`) against a temporary workdir.

Board facts are parsed from captured samples in tests/data/board_samples/<board>/: a sysroot tree (device-tree
model, cpufreq, thermal zones, meminfo, os-release) and vcgencmd outputs, served by a tiny fake vcgencmd because
the Raspberry Pi firmware tool cannot run here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from orchestrator.paths import BOARD_SOURCE_DIR, PROJECT_ROOT
from orchestrator.versions import executorch_version

AGENT_DIR = BOARD_SOURCE_DIR / "agent"
BOARD_SAMPLES = PROJECT_ROOT / "tests" / "data" / "board_samples"
# The agent must see neither a real board's overrides nor the caller's ssh session.
_SCRUBBED_ENV = ("ETLAB_AGENT_SYSROOT", "ETLAB_AGENT_VCGENCMD", "ETLAB_WORKDIR", "SSH_CLIENT", "SSH_CONNECTION")


@dataclass
class AgentResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def document(self) -> dict[str, Any]:
        """The one JSON document the agent printed."""
        try:
            return json.loads(self.stdout)
        except ValueError as exc:
            raise AssertionError(f"agent stdout is not one JSON document:\n{self.stdout}\n{self.stderr}") from exc


def agent_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _SCRUBBED_ENV}
    env["PYTHONPATH"] = str(AGENT_DIR)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # keep board/ free of __pycache__ (it is hashed when pushed)
    env.update(extra or {})
    return env


class AgentCli:
    """`python -m etlab_agent --workdir WD ...`, run for real."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.env = dict(env or {})

    def argv(self, args: Sequence[str | Path], python_args: Sequence[str] = ()) -> list[str]:
        return [sys.executable, *python_args, "-m", "etlab_agent", "--workdir", str(self.workdir), *map(str, args)]

    def run(
        self,
        *args: str | Path,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        python_args: Sequence[str] = (),
    ) -> AgentResult:
        completed = subprocess.run(
            self.argv(args, python_args),
            env=agent_env({**self.env, **(env or {})}),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return AgentResult(completed.returncode, completed.stdout, completed.stderr)

    def start(self, *args: str | Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(args),
            env=agent_env({**self.env, **(env or {})}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def finish(process: subprocess.Popen[str], timeout: float = 120) -> AgentResult:
        stdout, stderr = process.communicate(timeout=timeout)
        return AgentResult(process.returncode, stdout, stderr)

    def bundle(self, run_id: str) -> Path:
        return self.workdir / "bundles" / run_id

    def read_bundle_json(self, run_id: str, name: str) -> Any:
        return json.loads((self.bundle(run_id) / name).read_text())


@pytest.fixture
def agent(tmp_path: Path) -> AgentCli:
    """An agent on an empty, unprovisioned workdir."""
    return AgentCli(tmp_path / "workdir")


@pytest.fixture
def provisioned_agent(agent: AgentCli, runner_binary: Path) -> AgentCli:
    """An agent whose state.json names the real runner, as provisioning leaves it."""
    result = agent.run(
        "set-state", f"executorch_version={executorch_version()}", f"runner_path={runner_binary}", "runner_version=test"
    )
    assert result.returncode == 0, result.stderr
    return agent


def write_fake_vcgencmd(folder: Path, sample: str) -> Path:
    """A stand-in for the firmware's vcgencmd: prints the sample's captured output for a command."""
    captured = BOARD_SAMPLES / sample / "vcgencmd"
    script = folder / f"vcgencmd-{sample}"
    script.write_text(
        "#!/bin/sh\n"
        "# Test-only: replays vcgencmd output captured from a board.\n"
        f'file={shlex.quote(str(captured))}/"$1".txt\n'
        '[ -f "$file" ] || { echo "error=1 error_msg=\\"Command not registered\\"" >&2; exit 1; }\n'
        'cat "$file"\n'
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def board_sample_env(tmp_path: Path) -> Callable[[str], dict[str, str]]:
    """Environment that points the agent's probes at a captured board sample (vcgencmd only where captured)."""

    def make(sample: str) -> dict[str, str]:
        root = BOARD_SAMPLES / sample
        assert (root / "sysroot").is_dir(), f"no board sample {sample}"
        vcgencmd = write_fake_vcgencmd(tmp_path, sample) if (root / "vcgencmd").is_dir() else tmp_path / "no-vcgencmd"
        return {"ETLAB_AGENT_SYSROOT": str(root / "sysroot"), "ETLAB_AGENT_VCGENCMD": str(vcgencmd)}

    return make


def hung_runner(folder: Path) -> tuple[Path, Path]:
    """Test-only stand-in for a runner that hangs: it ignores SIGTERM and leaves a child in its group.

    Returns the script and the file where it writes "<its pid> <child pid>".
    """
    pid_file = folder / "hung-runner.pids"
    script = folder / "hung_runner.sh"
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo \'{"runner_version": "stand-in", "executorch_version": "0"}\'; exit 0; fi\n'
        "trap '' TERM\n"  # ignored signals stay ignored in the child too
        'echo "stand-in runner: hanging with args $*"\n'
        "sleep 300 &\n"
        f'echo "$$ $!" > {shlex.quote(str(pid_file))}\n'
        "wait\n"
    )
    script.chmod(0o755)
    return script, pid_file


def wait_for(condition: Callable[[], Any], timeout: float = 30, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def process_gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped (PID 1 here does not reap reparented children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return fields[0] in ("Z", "X")


def agent_workdir(workdir: Path) -> Path:
    """A workdir holding the real board agent and click, as setup-board leaves them (without the runtime)."""
    shutil.copytree(AGENT_DIR, workdir / "board" / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    (workdir / "pylib").mkdir()
    (workdir / "pylib" / "click").symlink_to(Path(click.__file__).parent)
    (workdir / "bundles").mkdir()
    return workdir


@contextlib.contextmanager
def holding_lock(workdir: Path, holder: dict[str, Any]) -> Iterator[Path]:
    """The agent's board lock held (as a run holds it), by `holder` as lock.json describes it."""
    (workdir / "lock.json").write_text(json.dumps(holder))
    with open(workdir / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield workdir
