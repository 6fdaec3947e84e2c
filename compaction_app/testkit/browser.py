"""Debian's Chromium through Playwright (never a downloaded browser), headless and quiet: the
one launch the browser tests and bench/screenshots.py share."""

from __future__ import annotations

from typing import Any

CHROMIUM = "/usr/bin/chromium"


def launch_chromium(playwright: Any) -> Any:
    """A Chromium browser from a started `sync_playwright()`; the caller closes it."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )
