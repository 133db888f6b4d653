"""Fixtures shared by the browser tests: Debian's Chromium driven by Playwright
(``browser_support`` says what happens when either is missing).  The watched page records
console errors, uncaught page errors and every request that leaves loopback (the course
must work offline); such a request is aborted, so a page that depends on a CDN shows it as
a missing figure too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from browser_support import CHROMIUM, CHROMIUM_ARGS, sync_api  # noqa: E402


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium browser (Playwright), once it is known to be installed."""
    with sync_api().sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class WatchedPage:
    """A page that keeps its console errors, page errors and off-loopback requests."""

    def __init__(self, browser, width: int = 1300, height: int = 1000):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.set_default_timeout(60_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.external: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(
            f"console error at {self.page.url}: {msg.text[:300]}"))
        self.page.route("**/*", self._route)

    def _route(self, route):
        url = route.request.url
        host = urlparse(url).hostname or ""
        if url.startswith(("data:", "blob:", "about:")) or host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def watched(chromium):
    page = WatchedPage(chromium)
    try:
        yield page
    finally:
        page.close()
