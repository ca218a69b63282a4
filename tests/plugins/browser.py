"""Debian's Chromium driven by Playwright (never `playwright install`), for tests that look at pages."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.paths import PROJECT_ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = PROJECT_ROOT / "test-artifacts"


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: run ./bootstrap.sh --test (apt-get install chromium)")
    SCREENSHOTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[Any]:
    page = chromium.new_page(viewport={"width": 1600, "height": 1000})
    try:
        yield page
    finally:
        page.close()


def screenshot(page: Any, folder: Path, name: str, *, full_page: bool = True) -> Path:
    """A screenshot of `page` as `<name>.png` in `folder` (the test's tmp dir), copied into $ETLAB_SCREENSHOTS when
    it names a folder, so whoever reviews a change can look at the pages the tests drew."""
    path = Path(folder) / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    shots = os.environ.get("ETLAB_SCREENSHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(shots) / path.name)
    return path
