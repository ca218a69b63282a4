"""What etlab's local servers raise when they cannot start: light (no server code), so the command layer can name
the option that mends them without loading a server."""

from __future__ import annotations

from orchestrator.errors import EtlabError


class ExplorerError(EtlabError):
    """Model Explorer could not be started."""


class PortBusy(ExplorerError):
    """Something listens on the port already; the command layer names the option that picks another."""
