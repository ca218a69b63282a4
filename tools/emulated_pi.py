#!/usr/bin/env python3
"""Start an emulated Raspberry Pi (aarch64 under qemu-user, over SSH) by hand, print an inventory snippet, and
stop it on Ctrl+C. Needs root, qemu-user-static and mmdebstrap (`./bootstrap.sh --test` installs them).

    sudo .venv/bin/python tools/emulated_pi.py                 # a Pi 5
    sudo .venv/bin/python tools/emulated_pi.py --flavour pi4 --no-compiler
    sudo .venv/bin/python tools/emulated_pi.py --prepare       # only build/unpack the cached rootfs
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from orchestrator.testing.pi import FLAVOURS, emulation_problem, ensure_rootfs, rootfs_archive, start_pi_board
from orchestrator.testing.sshd import LabSetupError, SshdLab


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavour", choices=sorted(FLAVOURS), default="pi5")
    parser.add_argument("--name", default=None, help="board name (default: the flavour)")
    parser.add_argument("--no-compiler", action="store_true", help="hide g++ (to try build: workstation|auto)")
    parser.add_argument("--throttled", type=lambda text: int(text, 0), default=0, help="vcgencmd value, e.g. 0x50005")
    parser.add_argument("--prepare", action="store_true", help="build and unpack the rootfs, then exit")
    args = parser.parse_args()
    problem = emulation_problem()
    if problem:
        print(f"emulated_pi: {problem}", file=sys.stderr)
        return 69
    try:
        started = time.monotonic()
        lower = ensure_rootfs()
        if args.prepare:
            print(f"rootfs ready: {lower} (archive {rootfs_archive()}, {time.monotonic() - started:.0f} s)")
            return 0
        lab = SshdLab(Path(tempfile.mkdtemp(prefix="etlab-pi-")))
        fake = start_pi_board(lab, args.name or args.flavour, flavour=args.flavour, compiler=not args.no_compiler)
    except LabSetupError as exc:
        print(f"emulated_pi: {exc}", file=sys.stderr)
        return 69
    fake.set_throttled(args.throttled)
    board = fake.board
    where = f"{board.ssh.host}:{board.ssh.port}"
    print(f"# {fake.flavour.model} ({fake.flavour.core}) listening on {where}; Ctrl+C stops it")
    print(f"# control: echo 0x50005 > {fake.control / 'throttled'}   (what vcgencmd get_throttled answers)")
    print("defaults:")
    print(f"  known_hosts: {board.known_hosts}")
    print("boards:")
    print(f"  {board.name}: {{host: {board.ssh.host}, port: {board.ssh.port}, user: root, key: {board.ssh.key},")
    print(f"    tags: [{', '.join(board.tags)}], connect_timeout: 30, command_timeout: 3600}}")
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while fake.running:
            time.sleep(1)
        print("emulated_pi: the board's sshd exited; see " + str(fake.log), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main())
