"""A real labgrid coordinator for the session (orchestrator/testing/labgrid.py); exporters and places per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orchestrator.testing.labgrid import LabgridLab


@pytest.fixture(scope="session")
def labgrid_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabgridLab]:
    lab = LabgridLab(tmp_path_factory.mktemp("labgrid"))
    yield lab
    lab.close()


@pytest.fixture
def private_labgrid_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabgridLab]:
    """A coordinator of the test's own, for tests that kill it."""
    lab = LabgridLab(tmp_path_factory.mktemp("labgrid-private"))
    yield lab
    lab.close()
