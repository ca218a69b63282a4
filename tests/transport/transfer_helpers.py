"""Helpers shared by the transfer tests (test_transfer.py, test_transfer_openssh.py, test_pull_archives.py): odd names,
models and bundles to move, leftovers, and a link cut once mid-transfer."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from orchestrator.fsutil import TMP_PREFIX
from orchestrator.results.bundle import MANIFEST
from tests.plugins.sshd import NetnsBoard

ODD = "odd 'dir' \"q\" $x; `y`\nline2"
# auto: transfers from BULK_FROM go through OpenSSH's ssh client; paramiko: everything over paramiko.
BULK_MODES = ["auto", "paramiko"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_model(folder: Path, size: int, name: str = "model.pte") -> tuple[Path, str]:
    path = folder / name
    data = os.urandom(size)
    path.write_bytes(data)
    return path, sha(data)


def write_bundle(folder: Path, files: dict[str, bytes], *, manifest_files: dict | None = None) -> None:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    listed = (
        manifest_files
        if manifest_files is not None
        else {name: {"sha256": sha(data), "size": len(data)} for name, data in files.items()}
    )
    manifest = {"schema": 1, "run_id": folder.name, "status": "ok", "files": listed}
    (folder / MANIFEST).write_text(json.dumps(manifest))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(TMP_PREFIX)) if folder.exists() else []


@contextlib.contextmanager
def link_cut_once(netns_board: NetnsBoard, folder: Path, pattern: str) -> Iterator[threading.Event]:
    """Blackhole the board's link for 5 s as soon as a file matching `pattern` in `folder` passes 4 MiB, so the
    transfer under way fails (keepalives and tcp_user_timeout are 3 s) and must be retried. Yields the event
    that says the cut happened."""
    cut = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set() and not cut.is_set():
            growing = list(folder.glob(pattern)) if folder.exists() else []
            if any(p.stat().st_size > 4 << 20 for p in growing if p.exists()):
                netns_board.blackhole()  # packets vanish: only timeouts and keepalives can notice
                cut.set()
                time.sleep(5.0)
                netns_board.restore()
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield cut
    finally:
        done.set()
        watcher.join()
        netns_board.restore()


BUNDLE = {
    "timings.json": b'{"iterations_ms": [1.0]}',
    "etdump.etdp": os.urandom(300_000),
    "outputs.etlt": os.urandom(5000),
    "runner.log": b"line\n",  # only the files a board writes (results/bundle.py BOARD_FILES); others are refused
    "board_info_before.json": b"\0" * 10,
}
