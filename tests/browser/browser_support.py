"""What every browser test shares: Debian's Chromium and its flags, Playwright, one rule for
skipping when they are missing, and starting/stopping a local server's process tree.

Without Chromium or the playwright package a test skips, unless its REQUIRE variable is 1
(CI sets REQUIRE_BROWSER_TEST=1, and REQUIRE_HUB_TEST=1 for the hub test): then it fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest

CHROMIUM = "/usr/bin/chromium"
REQUIRE = os.environ.get("REQUIRE_BROWSER_TEST", "") == "1"
# The flags this machine's Chromium needs headless as root with no network (see
# scripts/install_browser.sh): without the background-networking ones it keeps dialling out.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def unavailable(reason: str, variable: str = "REQUIRE_BROWSER_TEST",
                fix: str = "run `bash scripts/install_browser.sh`"):
    """Skip for a missing tool, or fail where ``variable`` is 1 (CI)."""
    if os.environ.get(variable, "") == "1":
        pytest.fail(f"{reason} ({variable}=1; {fix})", pytrace=False)
    pytest.skip(f"{reason}; {fix} (CI sets {variable}=1)")


def sync_api(unavailable=unavailable):
    """Playwright's sync API, once Chromium and the client are known to be there."""
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"no Chromium at {CHROMIUM}")
    try:
        from playwright import sync_api as api
    except ImportError as exc:
        api, missing = None, f"the playwright Python package is not importable ({exc})"
    if api is None:  # outside the except block: no chained traceback in the report
        unavailable(missing)
    return api


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list:
    import psutil  # a dependency of ipykernel, so always in the course venv

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def stop_server(proc: subprocess.Popen, children: list) -> None:
    """SIGTERM a server (SIGKILL after 20 s), then kill the ``children`` it left: kernels and
    their device processes."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    for child in children:
        try:
            if child.is_running():
                child.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
