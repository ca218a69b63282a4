"""`<wd>/state.json`: what provisioning installed (executorch version, board tree hash, runner)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import BadInput, NotProvisioned
from .files import atomic_write_json, read_json
from .workdir import Workdir

STATE_KEYS = (
    "executorch_version",
    "board_tree_sha256",
    "runner_source_sha256",
    "runner_path",
    "runner_version",
    "runner_build",
    "provisioned_at",
    "limits",  # the board's measured limits (its read bandwidth), JSON text written by the workstation
    "compute",  # its peak arithmetic rate (fp32 and int8 GEMM through XNNPACK), JSON text written by the workstation
)


def read_state(workdir: Workdir) -> dict[str, Any] | None:
    """The state, or None when the board was never provisioned."""
    try:
        state = read_json(workdir.state)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise NotProvisioned(f"{workdir.state} is unreadable ({exc}): provision the board again") from exc
    if not isinstance(state, dict):
        raise NotProvisioned(f"{workdir.state} does not hold a JSON object: provision the board again")
    return state


def update_state(workdir: Workdir, updates: dict[str, str | None]) -> dict[str, Any]:
    """Merge `updates` into state.json atomically; a None value removes the key."""
    unknown = sorted(set(updates) - set(STATE_KEYS))
    if unknown:
        raise BadInput(f"unknown state key(s) {', '.join(unknown)}; known keys: {', '.join(STATE_KEYS)}")
    state = read_state(workdir) or {}
    for key, value in updates.items():
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    workdir.root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(workdir.state, state)
    return state


def runner_from_state(workdir: Workdir) -> tuple[Path, str | None]:
    """The provisioned runner binary and the ExecuTorch version it must report; NotProvisioned otherwise."""
    state = read_state(workdir)
    if state is None:
        raise NotProvisioned(f"board not provisioned: {workdir.state} is missing")
    runner_path = state.get("runner_path")
    version = state.get("executorch_version")
    if not runner_path and version:
        runner_path = str(workdir.root / "runner" / str(version) / "etlab_runner")
    if not runner_path:
        raise NotProvisioned(f"board not provisioned: {workdir.state} names no runner_path")
    runner = Path(str(runner_path)).expanduser()
    if not runner.is_absolute():
        runner = workdir.root / runner
    if not runner.is_file():
        raise NotProvisioned(f"runner {runner} named in {workdir.state} is missing: provision the board again")
    return runner, (str(version) if version else None)
