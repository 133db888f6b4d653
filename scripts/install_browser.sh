#!/usr/bin/env bash
# Install what tests/browser/test_jupyterlab.py needs: Debian's Chromium (/usr/bin/chromium)
# and the Playwright Python client, which only drives that Chromium (no browser of
# Playwright's own is downloaded: `playwright install` is never run).
#
#   bash scripts/install_browser.sh [PYTHON]     # PYTHON defaults to the repo's .venv/bin/python
#
# Idempotent: each step is skipped when its result is already there.  apt-get needs root
# (or sudo) and runs only when Chromium is missing.  CI runs it after creating .venv and
# sets REQUIRE_BROWSER_TEST=1, so that a missing browser fails the test instead of
# skipping it.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$REPO/.venv/bin/python}
PLAYWRIGHT_VERSION=1.65.2

if [ ! -x "$(command -v "$PY" || true)" ]; then
    echo "install_browser: no python at $PY (create the venv first, e.g. python3 -m venv .venv)" >&2
    exit 1
fi

if [ ! -x /usr/bin/chromium ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    echo "install_browser: installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # fonts-liberation is only recommended by chromium; without it screenshots fall
    # back to whatever font fontconfig finds.
    $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null
fi

if ! "$PY" -c "import playwright.sync_api" 2>/dev/null; then
    echo "install_browser: installing playwright==$PLAYWRIGHT_VERSION into $PY"
    "$PY" -m pip install -q --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION"
fi

echo "install_browser: $(/usr/bin/chromium --version 2>/dev/null | tail -n 1);" \
     "playwright $("$PY" -c 'from importlib.metadata import version; print(version("playwright"))')"
