"""A private PostgreSQL server: a lab's shared history, for real (tests/plugins/postgres.py, bench/bench_lab.py).

initdb refuses to run as root, so the cluster belongs to the `postgres` user that Debian's package creates.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from orchestrator.testing.sshd import free_port


def _pg_bin() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if not candidates:
        raise RuntimeError("PostgreSQL is not installed: run ./bootstrap.sh --test (apt-get install postgresql)")
    return Path(candidates[0]).parent


def _as_postgres(argv: list[str]) -> list[str]:
    return argv if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *argv]


@contextlib.contextmanager
def private_postgres() -> Iterator[str]:
    """`postgresql+psycopg://postgres@127.0.0.1:<port>/postgres`, trust auth, loopback only, gone afterwards."""
    binaries = _pg_bin()
    # Not under pytest's tmp folders: those are private to root, and the server runs as `postgres`.
    root = Path(tempfile.mkdtemp(prefix="etlab-postgres-"))
    data = root / "data"
    data.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(data, "postgres")
    subprocess.run(
        _as_postgres([str(binaries / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    port = free_port("127.0.0.1")
    options = f"-h 127.0.0.1 -p {port} -k {data}"
    subprocess.run(
        _as_postgres(
            [str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-w", "-l", str(data / "log"), "start"]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            _as_postgres([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True
        )
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(server_url: str) -> str:
    """A new, empty database on the server: its URL."""
    import sqlalchemy

    database = f"etlab_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(sqlalchemy.text(f"create database {database}"))
    admin.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{database}"
