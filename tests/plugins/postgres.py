"""A private PostgreSQL server for the history tests (orchestrator/testing/postgres.py): the shared-lab path."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """`postgresql+psycopg://postgres@127.0.0.1:<port>/postgres`, trust auth, loopback only."""
    from orchestrator.testing.postgres import private_postgres

    try:
        server = private_postgres()
        url = server.__enter__()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield url
    finally:
        server.__exit__(None, None, None)
