"""The status page in a real browser (Debian's chromium, driven by Playwright): CI
installs chromium (.ci/run), so there a missing browser fails the test; elsewhere it skips."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Iterator

import pytest


@contextmanager
def status_page(url: str, query: str = "") -> Iterator:
    """The page at ``url``, loaded (its first poll answered); ``query``: its address's
    query string (``?token=...``)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is not installed (.ci/run installs it)")
        pytest.skip("no chromium here (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, timeout=60_000,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                                          "--disable-background-networking", "--disable-component-update",
                                          "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/" + query, timeout=60_000)
            page.wait_for_selector("body[data-loaded='1']", timeout=60_000)
            yield page
        finally:
            browser.close()
