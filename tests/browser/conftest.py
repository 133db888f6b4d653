"""Shared by the site and Voilà browser tests: Debian's Chromium driven by Playwright.

Without Chromium or the playwright package the tests skip, unless REQUIRE_BROWSER_TEST=1
(CI) turns the skip into a failure.  The page records console errors, uncaught page
errors and every request that leaves loopback (the course must work offline); such a
request is aborted, so a page that depends on a CDN shows it as a missing figure too.
"""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pytest

CHROMIUM = "/usr/bin/chromium"
REQUIRE = os.environ.get("REQUIRE_BROWSER_TEST", "") == "1"
# The flags this machine's Chromium needs headless as root with no network (see
# scripts/install_browser.sh): without the background-networking ones it keeps dialling out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def unavailable(reason: str):
    if REQUIRE:
        pytest.fail(f"{reason} (REQUIRE_BROWSER_TEST=1; run `bash scripts/install_browser.sh`)", pytrace=False)
    pytest.skip(f"{reason}; run `bash scripts/install_browser.sh` (CI sets REQUIRE_BROWSER_TEST=1)")


@pytest.fixture(scope="module")
def chromium():
    """A headless Chromium browser (Playwright), once it is known to be installed."""
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"no Chromium at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        sync_playwright, missing = None, f"the playwright Python package is not importable ({exc})"
    if sync_playwright is None:
        unavailable(missing)
    with sync_playwright() as pw:
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
