"""Shared test setup. Fixtures live in tests/plugins/<area>.py, one module per area, listed here."""

from __future__ import annotations

import os

# No model hub is reachable here. huggingface_hub reads this once, at import: set later (monkeypatch), it is
# ignored and every pretrained lookup waits on the network before it fails.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

pytest_plugins = [
    "tests.plugins.processes",  # reaps every process a test starts; loads first so its hooks wrap the rest
    "tests.plugins.internal_errors",  # the session fails if any `fab` a test started exited 70 (a bug)
    "tests.plugins.artifacts",  # tiny models lowered with the real pipeline, cached across sessions
    "tests.plugins.quantized",  # their int8-dynamic, int8-static and 8da4w XNNPACK variants, cached too
    "tests.plugins.runner",  # the native runner, built once per source hash
    "tests.plugins.agent",  # the board agent run locally
    "tests.plugins.sshd",  # fake boards: real OpenSSH servers on 127.0.0.x
    "tests.plugins.pi",  # emulated aarch64 Raspberry Pis: the rootfs's own sshd under qemu-user
    "tests.plugins.boards",  # labs of fake boards with an inventory, driven through `fab`
    "tests.plugins.analysis",  # real bundles from the runner, and the Model Explorer adapter
    "tests.plugins.explorer",  # the Model Explorer server preloaded with a real analysed bundle
    "tests.plugins.browser",  # Debian's Chromium through Playwright
    "tests.plugins.dashboard",  # a small real lab (analysed runs, a nightly history) for the dashboard
    "tests.plugins.generation",  # a real two-night nightly of a tiny language model on the local board
    "tests.plugins.postgres",  # a private PostgreSQL server for the shared-history path
    "tests.plugins.labgrid",  # a real labgrid coordinator and exporters publishing the fake boards as places
    "tests.plugins.fuzz",  # no fixtures: the hypothesis settings and byte mutations of the parser fuzz tests
    "tests.plugins.schedule",  # no fixtures: the order xdist's workers take the files in, the longest first
]
