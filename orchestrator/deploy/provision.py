"""`fab setup-board`: make a board able to run our runner, offline, and idempotently.

The board needs only python3 and what we push: the board/ tree, the click wheel for the agent, the ExecuTorch
SDK from the wheel built for the board's platform (at exactly the workstation's executorch version), and the
runner. The runner is built on the board when it has g++ (with cmake/ninja wheels when the board has none
recent enough), or cross-built on the workstation and pushed (`build: board | workstation | auto`). A board
that is already up to date costs one probe round trip and one agent `info` (whether its limits were measured under
the board's conditions now: boards/limits.py); before a run, `quick_check` settles even that with one
shell command (no Python start, no compiler probing) and falls back to the probe when anything is off.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import posixpath
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from shlex import quote
from typing import Any

from orchestrator import console, paths, strictjson
from orchestrator.boards import limits as board_limits
from orchestrator.boards.limits import ComputePeak, ReadBandwidth, peak_text
from orchestrator.boards.workdir import BoardWorkdir
from orchestrator.deploy import board_limits as limits_probe
from orchestrator.deploy import crossbuild
from orchestrator.deploy.agent_client import BoardAgent
from orchestrator.deploy.payload import (
    MIN_GLIBC,
    board_tarball,
    fetch_wheel,
    tree_sha256,
    verify_model,
    version_tuple,
)
from orchestrator.errors import BoardDataError, BoardError, BoardSetupError
from orchestrator.transport import BoardConnection
from orchestrator.transport.transfer import push_file
from orchestrator.versions import executorch_version

MIN_CMAKE = (3, 28)
PROBE_SOURCE = Path(__file__).with_name("board_probe.py")


@dataclass
class ProvisionReport:
    board: str
    arch: str = ""
    executorch_version: str = ""
    runner_version: str | None = None
    up_to_date: bool = False
    actions: list[str] = field(default_factory=list)
    seconds: float = 0.0
    bandwidth: ReadBandwidth | None = None  # the board's memory read bandwidth (boards/limits.py)
    compute: ComputePeak | None = None  # its peak arithmetic rate (fp32 and int8 GEMM through XNNPACK)
    limits_notes: list[str] = field(default_factory=list)  # why a limit was not measured


# ---------------------------------------------------------------- probing


def probe(conn: BoardConnection, workdir: str) -> dict[str, Any]:
    """Facts about the board from board_probe.py, run with the board's own python3."""
    result = conn.run(["python3", "-c", PROBE_SOURCE.read_text(), workdir], timeout=90, check=False)
    if result.exit_code == 127 or "python3: not found" in result.stderr or "No such file" in result.stderr[:200]:
        raise BoardError(
            f"{conn.board.name}: python3 is not installed on the board",
            hint="on the board: sudo apt-get install -y python3",
        )
    if result.exit_code != 0:
        raise BoardError(f"{conn.board.name}: probing the board failed: {result.stderr.strip()[-300:]}")
    return checked_facts(conn.board.name, result.stdout)


# What the probe must answer, by key: a board's answer is untrusted (it names wheels to fetch and paths to use).
_FACT_KINDS: dict[str, tuple[type, ...]] = {
    "workdir": (str,), "arch": (str,), "system": (str,), "python": (str,), "python_tag": (str,), "libc": (str,),
    "glibc": (str, type(None)), "compiler": (str, type(None)), "compiler_version": (str, type(None)),
    "cmake": (str, type(None)), "cmake_version": (str, type(None)), "ninja": (str, type(None)),
    "state": (dict, type(None)), "runner": (dict, type(None)), "agent_present": (bool,), "free_mb": (int, type(None)),
}  # fmt: skip
# The fields of state.json and of the runner's --version answer that provisioning reads: each a string when present.
_NESTED_KINDS: dict[str, dict[str, tuple[type, ...]]] = {
    "state": {key: (str,) for key in (
        "executorch_version", "board_tree_sha256", "runner_source_sha256", "runner_path", "runner_build",
    )},
    "runner": {"executorch_version": (str,), "runner_version": (str,)},
}  # fmt: skip
_ARCH = re.compile(r"[A-Za-z0-9_]{1,32}")
_VERSION = re.compile(r"\d+(\.\d+){0,3}")


# state.json, whether the agent is there, and the runner's own version answer, in one command without Python.
_QUICK_CHECK = (
    'cat -- "$1" && printf "\\n%s\\n" "$4" && if [ -f "$2" ]; then echo agent; else echo none; fi'
    ' && printf "%s\\n" "$4" && "$3" --version'
)
_QUICK_SEPARATOR = "@@etlab-quick-check@@"


def quick_check(conn: BoardConnection) -> ProvisionReport | None:
    """An up-to-date report when the board's state, agent and runner match this workstation, else None.

    For the warm path before a run (`setup_board` probes far more: compilers, cmake, glibc). Anything missing,
    different or malformed answers None, and the caller provisions the full way, which re-checks everything."""
    started = time.perf_counter()
    wanted = executorch_version()
    wd = BoardWorkdir(conn.workdir.rstrip("/") or "/")
    runner_path = posixpath.join(wd.runner(wanted), "etlab_runner")
    agent_main = posixpath.join(wd.board_tree, "agent", "etlab_agent", "__main__.py")
    state_path = posixpath.join(wd.root, "state.json")
    argv = ["sh", "-c", _QUICK_CHECK, "sh", state_path, agent_main, runner_path, _QUICK_SEPARATOR]
    result = conn.run(argv, timeout=60, check=False)
    parts = result.stdout.split(f"\n{_QUICK_SEPARATOR}\n")
    if result.exit_code != 0 or len(parts) != 3:
        return None
    try:
        state, runner = strictjson.loads(parts[0], where="state.json"), strictjson.loads(parts[2], where="runner")
    except ValueError:
        return None
    if not isinstance(state, dict) or not isinstance(runner, dict) or state.get("runner_path") != runner_path:
        return None
    if not all(isinstance(runner.get(key), str | None) for key in ("executorch_version", "runner_version")):
        return None
    facts = {"state": state, "runner": runner, "agent_present": parts[1].strip() == "agent"}
    if _problems(facts, board_tarball()[1], conn.board.build):
        return None
    report = ProvisionReport(conn.board.name, executorch_version=wanted, up_to_date=True)
    report.runner_version = runner.get("runner_version")
    report.seconds = time.perf_counter() - started
    return report


def checked_facts(board: str, text: str) -> dict[str, Any]:
    """The probe's JSON, refused (BoardDataError) unless every fact has its documented type and shape."""
    try:
        facts = strictjson.loads(text, where="the board probe sent malformed output")
    except ValueError as exc:
        raise BoardDataError(f"{board}: {exc}") from None
    if not isinstance(facts, dict):
        raise BoardDataError(f"{board}: the board probe sent malformed output: not a JSON object")
    for key, kinds in _FACT_KINDS.items():
        value = facts.get(key)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise BoardDataError(f"{board}: the board probe sent malformed output: {key} is {json.dumps(value)[:80]}")
    for key, fields in _NESTED_KINDS.items():
        for field_name, kinds in fields.items():
            value = (facts[key] or {}).get(field_name)
            if value is not None and not isinstance(value, kinds):
                raise BoardDataError(
                    f"{board}: the board probe sent malformed output: {key}.{field_name} is {json.dumps(value)[:80]}",
                    hint="on the board: remove state.json from the workdir, then provision again",
                )
    shapes = {"arch": _ARCH, "python": _VERSION, "glibc": _VERSION}
    for key, pattern in shapes.items():
        if facts[key] is not None and not pattern.fullmatch(facts[key]):
            raise BoardDataError(f"{board}: the board probe sent malformed output: {key} {facts[key][:40]!r}")
    if not facts["workdir"].startswith("/"):
        raise BoardDataError(f"{board}: the board probe sent malformed output: workdir {facts['workdir'][:80]!r}")
    return facts


# ---------------------------------------------------------------- provisioning


def _problems(facts: dict[str, Any], tree: str, build: str = "auto") -> list[str]:
    """Why a board is not up to date (empty list: nothing to do)."""
    state = facts.get("state") or {}
    wanted = executorch_version()
    reasons = []
    if not state:
        reasons.append("not provisioned")
    elif state.get("executorch_version") != wanted:
        reasons.append(f"runtime is executorch {state.get('executorch_version')}, workstation has {wanted}")
    elif state.get("board_tree_sha256") != tree:
        reasons.append("board/ sources changed")
    runner = facts.get("runner") or {}
    if state and not reasons and str(runner.get("executorch_version") or "").split("+")[0] != wanted:
        reasons.append("runner missing or built for another executorch")
    if state and not facts.get("agent_present"):
        reasons.append("agent missing")
    if state and not reasons and build != "auto" and state.get("runner_build", "board") != build:
        reasons.append(f"runner was built on the {state.get('runner_build', 'board')}, inventory says {build}")
    return reasons


def build_place(board_build: str, arch: str, facts: dict[str, Any]) -> str:
    """Where the runner is built for this board: "board" or "workstation" (BoardError when neither can).

    The fixes are in the message's one line: the per-board failure table shows only that."""
    board_has_compiler = bool(facts.get("compiler"))
    on_board = "on the board: sudo apt-get install -y g++ (or build-essential)"
    on_workstation = f"on the workstation: {crossbuild.install_hint(arch)}"
    if board_build == "board":
        if not board_has_compiler:
            raise BoardSetupError(
                f"no C++ compiler on the board to build the runner (build: board); fix {on_board}, "
                "or set build: workstation (or auto) to cross-build it"
            )
        return "board"
    cross = crossbuild.find_cross_compiler(arch)
    if board_build == "workstation":
        if cross is None:
            raise BoardError(
                f"no cross compiler for {arch} on the workstation (build: workstation); fix {on_workstation}, "
                f"or set build: board (or auto) and {on_board}"
            )
        return "workstation"
    if board_has_compiler:
        return "board"
    if cross is not None:
        return "workstation"
    raise BoardSetupError(
        f"cannot build the runner: no C++ compiler on the board, no cross compiler for {arch} on the workstation; "
        f"fix either {on_board}, or {on_workstation}"
    )


def setup_board(conn: BoardConnection, *, force: bool = False, verify: bool = True) -> ProvisionReport:
    started = time.perf_counter()
    name = conn.board.name
    workdir = conn.board.workdir
    facts = probe(conn, workdir)
    workdir = facts["workdir"]
    report = ProvisionReport(name, arch=facts["arch"], executorch_version=executorch_version())
    tarball, tree = board_tarball()
    reasons = ["--force"] if force else _problems(facts, tree, conn.board.build)
    if not reasons:
        report.up_to_date = True
        report.runner_version = (facts.get("runner") or {}).get("runner_version")
        state = facts.get("state") or {}
        if isinstance(state.get("runner_path"), str):
            _limits_of_a_provisioned_board(conn, BoardAgent(conn, workdir), state, report)
        report.seconds = time.perf_counter() - started
        return report

    _check_prerequisites(name, facts)
    try:
        place = build_place(conn.board.build, facts["arch"], facts)
    except BoardSetupError as exc:  # a board that cannot be set up is not an unreachable one: keep the class
        raise BoardSetupError(f"{name}: {exc}") from None
    except BoardError as exc:
        raise BoardError(f"{name}: {exc}") from None
    console.info(console.escape(f"  {name}: provisioning ({'; '.join(reasons)})"))
    state = facts.get("state") or {}
    wanted = executorch_version()
    agent = BoardAgent(conn, workdir)
    wd = BoardWorkdir(workdir)
    runner_source = tree_sha256(paths.BOARD_SOURCE_DIR / "runner")

    remote_tar = push_file(conn, tarball, kind="cache", suffix=".tar.gz").remote_path
    _install_tree(conn, remote_tar, wd.board_tree)
    report.actions.append("pushed board/")

    click_wheel = push_file(conn, fetch_wheel("click", "click>=8.0,<9", facts), kind="wheels", suffix=".whl")
    _run(conn, ["python3", wd.agent_bootstrap, "--wheel", click_wheel.remote_path,
                "--dest", wd.pylib], "installing click for the agent", timeout=300)  # fmt: skip
    # Bytecode now: the agent starts for every run, often with PYTHONDONTWRITEBYTECODE; a failure only costs speed.
    agent_sources = posixpath.join(wd.board_tree, "agent")
    conn.run(["python3", "-m", "compileall", "-q", agent_sources, wd.pylib], timeout=300, check=False)

    wheel: Path | None = None
    needs_runtime = (
        force
        or state.get("executorch_version") != wanted
        or not _remote_dir_exists(conn, posixpath.join(wd.runtime(wanted), "lib"))
    )
    if needs_runtime:
        wheel = fetch_wheel("executorch", f"executorch=={wanted}", facts, any_python=True)
        remote = push_file(conn, wheel, kind="wheels", suffix=".whl").remote_path
        sdk_parts = ("executorch/include/", "executorch/lib/", "executorch/share/")
        agent.unpack(remote, wd.runtime(wanted), prefixes=sdk_parts, strip="executorch/")
        report.actions.append(f"installed ExecuTorch {wanted} SDK ({wheel.name})")
    if place == "board":
        _ensure_build_tools(conn, agent, facts, workdir, report)

    runner_dir = wd.runner(wanted)
    runner_path = f"{runner_dir}/etlab_runner"
    runner_answer = facts.get("runner") or {}
    rebuild = (
        force
        or needs_runtime
        or state.get("runner_source_sha256") != runner_source
        or str(runner_answer.get("executorch_version") or "").split("+")[0] != wanted
        or state.get("runner_build", "board") != place
    )
    if rebuild and place == "board":
        with console.StageTimer(prefix=f"{name}: ").stage("build runner"):
            built = agent.build_runner(wd.runtime(wanted), wd.runner_sources, runner_dir)
        runner_path = built.get("runner") or built.get("runner_path") or runner_path
        report.actions.append("built the native runner")
    elif rebuild:
        wheel = wheel or fetch_wheel("executorch", f"executorch=={wanted}", facts, any_python=True)
        runner_path = _install_cross_built_runner(conn, facts["arch"], wheel, runner_source, runner_dir)
        report.actions.append(f"cross-built the native runner on the workstation for {facts['arch']}")

    if verify:
        _verify(conn, runner_path, wanted)
        report.actions.append("verified a built-in .pte")

    runner_version = _runner_version(conn, runner_path)
    agent.set_state(
        {
            "executorch_version": wanted,
            "board_tree_sha256": tree,
            "runner_source_sha256": runner_source,
            "runner_path": runner_path,
            "runner_version": runner_version,
            "runner_build": place,
            "provisioned_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        }
    )
    _remove_other_runtimes(conn, workdir, wanted)
    report.runner_version = runner_version
    _measure_limits(conn, agent, runner_source, report)
    report.seconds = time.perf_counter() - started
    return report


def _limits_of_a_provisioned_board(
    conn: BoardConnection, agent: BoardAgent, state: dict[str, Any], report: ProvisionReport
) -> None:
    """The limits the state records, when they were measured with the runner the board holds and under the board's
    conditions now (kernel, firmware, config.txt, governor: one `info` round trip); else measured again, saying what
    changed. A board provisioned before a probe, or with a malformed record, is measured too."""
    where = f"{conn.board.name}: state.json"
    runner_source = tree_sha256(paths.BOARD_SOURCE_DIR / "runner")
    now = limits_probe.conditions_now(agent)
    changes = limits_probe.changed_conditions(state, now, where)
    if changes:
        said = f"  {conn.board.name}: {'; '.join(changes)}: the board's limits are measured again"
        console.info(console.escape(said))
    current = not changes and board_limits.current(state, runner_source)
    if current:
        report.bandwidth = board_limits.recorded_bandwidth(state, where)
    if current and board_limits.current_compute(state, runner_source):
        report.compute = board_limits.recorded_compute(state, where)
    else:
        _measure_limits(conn, agent, runner_source, report, bandwidth=not current, conditions=now)


def _measure_limits(
    conn: BoardConnection,
    agent: BoardAgent,
    runner_source: str,
    report: ProvisionReport,
    *,
    bandwidth: bool = True,
    conditions: board_limits.MeasuredUnder | None = None,
) -> None:
    """The board's limits at its run thread count, into its state and the report (deploy/board_limits.py), with the
    board's conditions (`conditions`, else asked of its agent). A probe that cannot run is said (the board still runs
    programs); an answer that is malformed or absurd is refused (65) after the rest of the setup is kept."""
    measured = limits_probe.measure(conn, agent, runner_source, bandwidth=bandwidth, conditions=conditions)
    if bandwidth:
        report.bandwidth = measured.bandwidth
    report.compute = measured.compute
    report.limits_notes += measured.notes
    if measured.bandwidth is not None:
        report.actions.append(f"measured the read bandwidth ({measured.bandwidth.gb_per_s:.1f} GB/s)")
    if measured.compute is not None:
        report.actions.append(f"measured the peak ({peak_text(measured.compute)})")


def _check_prerequisites(name: str, facts: dict[str, Any]) -> None:
    if facts.get("system") != "Linux" or facts.get("libc") != "glibc":
        raise BoardSetupError(
            f"{name}: only glibc Linux boards are supported (found {facts.get('system')}, {facts.get('libc')})"
        )
    if version_tuple(facts.get("glibc")) < MIN_GLIBC:
        raise BoardSetupError(
            f"{name}: glibc {facts.get('glibc')} is too old; the ExecuTorch runtime needs glibc >= 2.28"
        )
    if facts.get("free_mb") is not None and facts["free_mb"] < 500:
        raise BoardSetupError(f"{name}: only {facts['free_mb']} MB free in the workdir's filesystem; need 500 MB")


def _install_cross_built_runner(
    conn: BoardConnection, arch: str, wheel: Path, runner_source: str, runner_dir: str
) -> str:
    """Cross-build the runner here, push it content-addressed (verified by hash on the board), install it."""
    compiler = crossbuild.find_cross_compiler(arch)
    if compiler is None:
        raise BoardError(
            f"{conn.board.name}: the cross compiler for {arch} disappeared", hint=crossbuild.install_hint(arch)
        )
    with contextlib.ExitStack() as held:  # the build stays in place (a shared lock) until it is on the board
        with console.StageTimer(prefix=f"{conn.board.name}: ").stage("cross-build runner"):
            binary = held.enter_context(
                crossbuild.cross_built_runner(
                    compiler, wheel, paths.BOARD_SOURCE_DIR / "runner", runner_source, executorch_version()
                )
            )
        pushed = push_file(conn, binary, kind="cache", suffix=".runner").remote_path
    target = f"{runner_dir}/{crossbuild.RUNNER_NAME}"
    script = (
        f"mkdir -p {quote(runner_dir)} && cp {quote(pushed)} {quote(target + '.tmp')} && "
        f"chmod 755 {quote(target + '.tmp')} && mv -f {quote(target + '.tmp')} {quote(target)}"
    )
    result = conn.run_shell(script, timeout=300, check=False)
    if result.exit_code != 0:
        raise BoardError(f"{conn.board.name}: installing the cross-built runner failed: {result.stderr.strip()[-300:]}")
    return target


def _ensure_build_tools(
    conn: BoardConnection, agent: BoardAgent, facts: dict[str, Any], workdir: str, report: ProvisionReport
) -> None:
    wd = BoardWorkdir(workdir)
    if version_tuple(facts.get("cmake_version")) < MIN_CMAKE:
        wheel = fetch_wheel("cmake", "cmake>=3.28,<5", facts)
        remote = push_file(conn, wheel, kind="wheels", suffix=".whl").remote_path
        agent.unpack(remote, wd.tool("cmake"), prefixes=("cmake/data/",), strip="cmake/data/")
        report.actions.append(f"installed {wheel.name.split('-')[0]} {wheel.name.split('-')[1]} (board cmake too old)")
    if not facts.get("ninja"):
        wheel = fetch_wheel("ninja", "ninja>=1.11", facts)
        remote = push_file(conn, wheel, kind="wheels", suffix=".whl").remote_path
        scripts = f"ninja-{wheel.name.split('-')[1]}.data/scripts/"
        agent.unpack(remote, wd.tool("ninja", "bin"), prefixes=(f"{scripts}ninja",), strip=scripts)
        report.actions.append("installed ninja")


def _install_tree(conn: BoardConnection, remote_tar: str, target: str) -> None:
    """Replace target with the tarball's content: extract beside it, then swap."""
    new, old = f"{target}.new", f"{target}.old"
    script = (
        f"rm -rf {quote(new)} {quote(old)} && mkdir -p {quote(new)} && "
        f"tar -xzf {quote(remote_tar)} -C {quote(new)} && "
        f"{{ [ ! -e {quote(target)} ] || mv {quote(target)} {quote(old)}; }} && "
        f"mv {quote(new)} {quote(target)} && rm -rf {quote(old)}"
    )
    result = conn.run_shell(script, timeout=300, check=False)
    if result.exit_code != 0:
        raise BoardError(f"{conn.board.name}: installing board/ failed: {result.stderr.strip()[-300:]}")


def _remote_dir_exists(conn: BoardConnection, path: str) -> bool:
    return conn.run(["test", "-d", path], timeout=60, check=False).exit_code == 0


def _run(conn: BoardConnection, argv: list[str], what: str, *, timeout: float) -> str:
    result = conn.run(argv, timeout=timeout, check=False)
    if result.exit_code != 0:
        detail = (result.stderr.strip() or result.stdout.strip())[-400:]
        raise BoardError(f"{conn.board.name}: {what} failed (exit {result.exit_code}): {detail}")
    return result.stdout


def _verify(conn: BoardConnection, runner_path: str, wanted: str) -> None:
    remote = push_file(conn, verify_model(), kind="models", suffix=".pte").remote_path
    _run(conn, [runner_path, "--model", remote, "--warmup", "0", "--iterations", "1", "--threads", "1",
                "--expect-executorch-version", wanted], "running the verification model", timeout=120)  # fmt: skip


def _runner_version(conn: BoardConnection, runner_path: str) -> str:
    text = _run(conn, [runner_path, "--version"], "asking the runner its version", timeout=60)
    try:
        answer = strictjson.loads(text, where="runner --version")
    except ValueError:
        answer = None
    version = answer.get("runner_version") if isinstance(answer, dict) else None
    if not isinstance(version, str) or not _VERSION.fullmatch(version.split("+")[0]):
        raise BoardDataError(f"{conn.board.name}: the runner answered --version with {text.strip()[:80]!r}")
    return version


def _remove_other_runtimes(conn: BoardConnection, workdir: str, keep: str) -> None:
    """Old runtime and runner versions are dead weight once the new one is verified."""
    script = (
        f"for d in {quote(workdir)}/runtime/* {quote(workdir)}/runner/*; do "
        f'[ -d "$d" ] && [ "$(basename "$d")" != {quote(keep)} ] && rm -rf "$d"; done; true'
    )
    conn.run_shell(script, timeout=300, check=False)
