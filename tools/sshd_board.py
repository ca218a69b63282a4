#!/usr/bin/env python3
"""Start a second board on this machine, without a Pi: a private OpenSSH server on 127.0.0.2 whose board folder is a
folder of its own (orchestrator/testing/sshd.py, the tests' fake boards), print its inventory entry, and stop it on
Ctrl+C. Needs OpenSSH's server (`sudo apt-get install -y openssh-server`; it is not started as a service).

    .venv/bin/python tools/sshd_board.py                       # board `sshd-b`, its files under /tmp/etlab-sshd-*
    .venv/bin/python tools/sshd_board.py --inventory two-boards.yaml   # and a new inventory: `local` and `sshd-b`
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from orchestrator.testing.sshd import LabSetupError, SshdLab


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default="sshd-b", help="board name (default: sshd-b)")
    parser.add_argument("--inventory", type=Path, help="write a new inventory file: the local board and this one")
    args = parser.parse_args()
    if args.inventory is not None and args.inventory.exists():
        print(f"sshd_board: {args.inventory} exists; name a new file (its boards are `local` and {args.name})",
              file=sys.stderr)  # fmt: skip
        return 64
    try:
        lab = SshdLab(Path(tempfile.mkdtemp(prefix="etlab-sshd-")))
        fake = lab.board(args.name)
    except LabSetupError as exc:
        print(f"sshd_board: {exc}", file=sys.stderr)
        return 69
    board = fake.board
    entry = {"host": board.ssh.host, "port": board.ssh.port, "user": board.ssh.user, "key": str(board.ssh.key)}
    print(f"# {board.name} listening on {board.ssh.host}:{board.ssh.port}; Ctrl+C stops it (its files: {lab.root})")
    print(yaml.safe_dump({"defaults": {"known_hosts": str(board.known_hosts)}, "boards": {board.name: entry}},
                         sort_keys=False, default_flow_style=None), end="")  # fmt: skip
    if args.inventory is not None:
        document = {"defaults": {"known_hosts": str(board.known_hosts)},
                    "boards": {"local": {"transport": "local"}, board.name: entry}}  # fmt: skip
        args.inventory.write_text(yaml.safe_dump(document, sort_keys=False))
        print(f"# written to {args.inventory}, with the local board")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while fake.running:
            time.sleep(1)
        print("sshd_board: the board's sshd exited", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main())
