"""Headless Chromium for the tests that render the project's HTML pages (the audit
page, the run report): find the browser, dump a page's DOM, take a screenshot."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def browser() -> str:
    """The browser's path, or skip: ``make test`` installs Chromium where it can."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path is not None:
            return path
    pytest.skip(
        "no Chromium on PATH: `make test` installs the Debian package `chromium` when run "
        "as root where apt-get exists; otherwise `apt-get install chromium` to run this test"
    )


def headless(path: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless run of the browser at ``path`` (a fresh ``profile`` directory)."""
    return subprocess.run(
        [
            path,
            "--headless",
            "--no-sandbox",  # root in CI containers; the page is our own file
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def dom(page: Path, profile: Path) -> str:
    """The DOM Chromium built from ``page`` (what it parsed, not the file's bytes)."""
    return headless(browser(), profile, "--dump-dom", page.as_uri()).stdout


def screenshot(page: Path, profile: Path, shot: Path, size: tuple[int, int]) -> Path:
    """A PNG of ``page`` in a window of ``size`` pixels."""
    headless(
        browser(),
        profile,
        f"--screenshot={shot}",
        f"--window-size={size[0]},{size[1]}",
        page.as_uri(),
    )
    return shot
