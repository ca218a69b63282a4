"""Everything a board sends is untrusted (1/2): names a board chose, a pull that outgrows its manifest, a model
corrupted on the board under the real agent, a full board disk, malformed agent answers; on real sshd boards.
Outputs, counters and bundles edited after the pull: test_board_data_bundles.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.boards.inventory import Board
from orchestrator.deploy.runs import RunParams, profile, pull, push_artifact
from orchestrator.errors import BoardError, BundleError, ExitCode
from orchestrator.fsutil import TMP_PREFIX
from orchestrator.lowering.artifacts import load_artifact
from orchestrator.lowering.variants import VARIANTS
from orchestrator.results.analysis import analyze_bundle
from orchestrator.results.bundle import MANIFEST
from orchestrator.results.store import new_run_id
from orchestrator.transport import connect
from orchestrator.transport.pull import pull_bundle
from tests.plugins.agent import AGENT_DIR, AgentCli
from tests.plugins.artifacts import ARTIFACT_CACHE
from tests.plugins.boards import write_inventory
from tests.plugins.runner import RunnerModels
from tests.plugins.sshd import SshdBoard
from tests.results.board_data_helpers import board_bundle, fab, files_under, install_agent, sha

# ---------------------------------------------------------------- 1. a board cannot choose where results land

HOSTILE_NAMES = {
    "model label climbs out": ("run-1", {"model": "../../../escaped", "backend": "xnnpack"}, "labels.model"),
    "absolute backend label": ("run-1", {"model": "tiny", "backend": "{outside}/abs"}, "labels.backend"),
    "run id with a space": ("run 1", {"model": "tiny", "backend": "xnnpack"}, "run_id"),
}


@pytest.mark.parametrize("case", list(HOSTILE_NAMES), ids=list(HOSTILE_NAMES))
def test_fab_pull_refuses_names_a_board_chose_and_keeps_the_raw_bundle(
    sshd_board: SshdBoard, tmp_path: Path, case: str
) -> None:
    run_id, labels, field = HOSTILE_NAMES[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    labels = {key: value.replace("{outside}", str(outside)) for key, value in labels.items()}
    install_agent(sshd_board)
    hostile = board_bundle(sshd_board, run_id, labels, {"outputs.etlt": b"x" * 100})
    good = board_bundle(sshd_board, "run-good", {"model": "tiny", "backend": "portable"})
    before = files_under(hostile)
    results = tmp_path / "a" / "b" / "results"  # deep, so '../../..' stays inside tmp_path
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output
    assert sshd_board.name in output and field in output and "refused" in output, output
    # Nothing of the hostile bundle landed anywhere; the good one did, where it belongs.
    assert files_under(results) == {f"{sshd_board.name}/tiny/portable/run-good/{n}" for n in ("run.json", MANIFEST)}
    assert list(outside.iterdir()) == [] and not (tmp_path / "escaped").exists()
    assert not any("escaped" in str(p) for p in tmp_path.rglob("*") if "home" not in p.parts)
    assert files_under(hostile) == before and good.is_dir()  # the raw bundles stay on the board


def test_a_manifest_entry_with_a_bad_name_is_refused(sshd_board: SshdBoard, tmp_path: Path) -> None:
    folder = board_bundle(sshd_board, "run-1", {"model": "tiny", "backend": "xnnpack"})
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"]["../../evil.txt"] = {"sha256": sha(b""), "size": 0}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    dest = tmp_path / "results" / "run-1"
    with connect(sshd_board.board) as conn, pytest.raises(BundleError, match=r"'\.\./\.\./evil\.txt': not a valid"):
        pull_bundle(conn, "~/.etlab/bundles/run-1", dest)
    assert not dest.exists() and not (tmp_path / "evil.txt").exists()


FAKE_TAR = r"""#!{python}
# Test-only: a hostile board's tar. It sends a manifest declaring 1000 bytes for etdump.etdp, then 64 MiB of it, and
# records that the whole archive went out (a workstation that checks sizes while streaming stops reading first).
import json, sys, tarfile
out = sys.stdout.buffer
def member(name, data_size):
    info = tarfile.TarInfo(name)
    info.size = data_size
    out.write(info.tobuf(format=tarfile.USTAR_FORMAT))
manifest = json.dumps({{"schema": 1, "run_id": "big", "status": "ok",
                       "files": {{"etdump.etdp": {{"sha256": "0" * 64, "size": 1000}}}}}}).encode()
member("./result_manifest.json", len(manifest))
out.write(manifest + bytes(-len(manifest) % 512))
member("./etdump.etdp", 64 << 20)
for _ in range(64):
    out.write(bytes(1 << 20))
out.write(bytes(1024))
out.flush()
open({marker!r}, "w").write("the whole archive was sent")
"""


@pytest.mark.parametrize("bulk", ["auto", "paramiko"])
def test_a_pull_stops_as_soon_as_a_file_outgrows_its_manifest_entry(
    sshd_boards: Callable[..., list[SshdBoard]], tmp_path: Path, bulk: str
) -> None:
    fake_bin = tmp_path / "hostile bin"
    fake_bin.mkdir()
    marker = tmp_path / "sent-everything"
    tar = fake_bin / "tar"
    tar.write_text(FAKE_TAR.format(python=sys.executable, marker=str(marker)))
    tar.chmod(0o755)
    (fake,) = sshd_boards(1, session_env={"PATH": f"{fake_bin}:/usr/bin:/bin"}, bulk_transfer=bulk)
    board_bundle(fake, "big", {})
    dest = tmp_path / "results" / "big"
    with (
        connect(fake.board) as conn,
        pytest.raises(BundleError, match=r"etdump\.etdp: size 67108864, the manifest says 1000"),
    ):
        pull_bundle(conn, "~/.etlab/bundles/big", dest)
    assert not dest.exists() and not [p for p in dest.parent.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert not marker.exists(), "the workstation read the whole oversized file before refusing it"


# ---------------------------------------------------------------- 3. the board runs only the model it was given


def place_model(agent: AgentCli, source: Path, kind: str = "models", suffix: str = ".pte") -> Path:
    """Lay a file out as a push does: content-addressed, with its sha256 sidecar."""
    digest = sha(source.read_bytes())
    path = agent.workdir / kind / f"{digest}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, path)
    Path(f"{path}.sha256").write_text(f"{digest}  {path.name}\n")
    return path


def flip_a_byte(path: Path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))  # same size: only a hash can tell


@pytest.mark.parametrize("what", ["model", "inputs file"])
def test_a_model_corrupted_on_the_board_never_runs_and_is_removed(
    provisioned_agent: AgentCli, runner_models: RunnerModels, what: str
) -> None:
    agent = provisioned_agent
    model = place_model(agent, runner_models.xnnpack_pte)
    inputs = place_model(agent, runner_models.inputs_etlt, "inputs", ".etlt")
    victim = model if what == "model" else inputs
    flip_a_byte(victim)

    result = agent.run("profile", "--model", model, "--inputs", inputs, "--run-id", "run-1", "--iterations", "1")

    assert result.returncode == 1, result.stdout + result.stderr
    assert result.document["error"].startswith(f"{what} on board is corrupt"), result.document
    assert "bundle" not in result.document
    assert not victim.exists() and not Path(f"{victim}.sha256").exists()  # so the next push sends it again
    survivor = inputs if what == "model" else model
    assert survivor.exists() and Path(f"{survivor}.sha256").exists()
    assert not list((agent.workdir / "bundles").iterdir())  # no bundle, no temporary left behind


def test_a_full_board_disk_is_reported_and_the_temporary_bundle_removed(
    provisioned_agent: AgentCli, runner_models: RunnerModels, tmp_path: Path
) -> None:
    agent = provisioned_agent
    model = place_model(agent, runner_models.xnnpack_pte)
    bundles = agent.workdir / "bundles"
    bundles.mkdir()
    answer, listing = tmp_path / "answer.json", tmp_path / "listing.txt"
    # A 4 KiB tmpfs over bundles/ in a private mount namespace: the board's disk is full, nothing else is.
    script = (
        'mount -t tmpfs -o size=4k tmpfs "$1" || exit 99\n'
        'shift; out="$1"; list="$2"; shift 2\n'
        '"$@" > "$out"; rc=$?\n'
        'ls -A "$BUNDLES" > "$list"; exit $rc'
    )
    argv = agent.argv(["profile", "--model", model, "--run-id", "run-1", "--iterations", "1", "--warmup", "0"])
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(bundles), str(answer), str(listing), *argv],
        env={**os.environ, "PYTHONPATH": str(AGENT_DIR), "PYTHONDONTWRITEBYTECODE": "1", "BUNDLES": str(bundles)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 99, f"cannot mount a tmpfs here: {done.stderr}"
    document = json.loads(answer.read_text())
    assert done.returncode == 1, done.stderr
    assert document["error"].startswith(f"no space left on {bundles}"), document
    assert "internal error" not in document["error"]
    assert listing.read_text().split() == []  # the run's .tmp- folder went at once


def test_a_corrupt_model_fails_the_run_and_the_next_push_sends_it_again(
    local_board: Board, tiny_artifacts: dict[str, Any], tmp_path: Path
) -> None:
    artifact = load_artifact("distilbert-tiny", VARIANTS["portable"], ARTIFACT_CACHE)
    params = RunParams(warmup=0, iterations=1)
    with connect(local_board) as conn:
        pushed = push_artifact(conn, artifact)
        flip_a_byte(Path(pushed.model.remote_path))
        assert push_artifact(conn, artifact).model.skipped  # re-pushing stays quick: the run does the check
        with pytest.raises(BoardError, match="model on board is corrupt"):
            profile(conn, artifact, pushed, params, new_run_id())
        repushed = push_artifact(conn, artifact)
        assert not repushed.model.skipped
        run = profile(conn, artifact, repushed, params, new_run_id())
        assert run.status == "ok", run.error
        bundle = pull(conn, run, artifact, tmp_path / "results")
    run_json = json.loads((bundle / "run.json").read_text())
    assert run_json["model_sha256"] == artifact.sha256 and run_json["model_sha256_source"] == "computed"
    assert json.loads((bundle / MANIFEST).read_text())["model_sha256"] == artifact.sha256
    summary = analyze_bundle(bundle, pte=artifact.pte, sidecar=artifact.sidecar)
    assert summary.data["latency"]["hashing_ms"]["model"] >= 0


# ---------------------------------------------------------------- also: agent answers are validated


HOSTILE_AGENT = """import json, sys
# Test-only: an agent on a hostile board answers `bundles` with entries of the wrong shape.
print(json.dumps({"bundles": [{"run_id": 5, "labels": {"model": ["x"]}}]}))
"""


def test_a_malformed_agent_answer_is_a_clear_board_error(sshd_board: SshdBoard, tmp_path: Path) -> None:
    package = sshd_board.workdir_path / "board" / "agent" / "etlab_agent"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(HOSTILE_AGENT)
    inventory = write_inventory(tmp_path / "inventory.yaml", [sshd_board.board])
    results = tmp_path / "results"

    pull = fab("pull", "--board", sshd_board.name, "--inventory", str(inventory), results=results)

    output = pull.stdout + pull.stderr
    assert pull.returncode == ExitCode.DATA, output  # the board answered: bad data, not unreachable
    assert "agent bundles sent malformed output" in output and "TypeError" not in output, output
    assert files_under(results) == set()
