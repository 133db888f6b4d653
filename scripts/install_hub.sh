#!/usr/bin/env bash
# Install what tests/browser/test_jupyterhub.py needs: a JupyterHub that serves the course to
# local Unix users, the way an instructor's single-machine hub (The Littlest JupyterHub's
# layout) does.  Run as root:
#
#   bash scripts/install_hub.sh
#
# Into $TOY_HUB_PREFIX (default /opt/toy-engine-hub):
#   venv/   JupyterHub, torch 2.13.0 and the course package (this checkout, installed as a
#           package -- not editable -- so checkpoints and traces come from the wheel).  The hub
#           runs from it as root and every learner's server runs from it as that learner.
#   proxy/  configurable-http-proxy from the npm registry.
#
# Why not the repo's .venv: LocalProcessSpawner starts each learner's server as the learner's
# own Unix user, who must be able to execute the interpreter.  A venv made from a Python under
# /root (pyenv; CI's .venv) is not executable by them, so the venv is made from a system Python
# 3.11 or newer (Debian's /usr/bin/python3 by default; TOY_HUB_PYTHON overrides).
#
# Idempotent; the course package is reinstalled from this checkout on every run (15 s), so the
# hub serves the code under test.  Also needs Debian's chromium + playwright in the test's
# own venv: scripts/install_browser.sh.
set -euo pipefail
umask 022

REPO=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${TOY_HUB_PREFIX:-/opt/toy-engine-hub}
PY=${TOY_HUB_PYTHON:-/usr/bin/python3}
JUPYTERHUB_VERSION=6.1.1   # pyproject.toml's "hub" extra and environment.yml agree
CHP_VERSION=5.3.0          # configurable-http-proxy; needs Node.js >= 20

if [ "$(id -u)" -ne 0 ]; then
    echo "install_hub: run as root (it writes $PREFIX, and the test adds Unix users)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt_updated=""
apt_install() {
    if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if [ ! -x "$PY" ] && [ "$PY" = /usr/bin/python3 ]; then
    echo "install_hub: installing Debian's python3"
    apt_install python3 python3-venv
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 11))' 2>/dev/null; then
    echo "install_hub: $PY is $("$PY" -V 2>&1 || echo missing); the course needs Python 3.11 or newer" \
         "(set TOY_HUB_PYTHON to such an interpreter every user can execute)" >&2
    exit 1
fi
if ! runuser -u nobody -- "$PY" -c pass 2>/dev/null; then
    echo "install_hub: $PY cannot be executed by other users (is it under /root?);" \
         "set TOY_HUB_PYTHON to a Python 3.11 or newer outside private home directories" >&2
    exit 1
fi
if [ ! -x "$PREFIX/venv/bin/python" ]; then
    if ! "$PY" -c "import ensurepip" 2>/dev/null; then
        echo "install_hub: installing Debian's python3-venv"
        apt_install python3-venv
    fi
    "$PY" -m venv "$PREFIX/venv"
fi
bash "$REPO/scripts/install_torch.sh" "$PREFIX/venv/bin/python"
if ! "$PREFIX/venv/bin/python" -c "import jupyterhub, jupyterlab" 2>/dev/null; then
    echo "install_hub: installing JupyterHub $JUPYTERHUB_VERSION and the course extras"
    "$PREFIX/venv/bin/pip" install -q "$REPO[course,hub]" "jupyterhub==$JUPYTERHUB_VERSION"
fi
echo "install_hub: installing the course package from $REPO"
"$PREFIX/venv/bin/pip" install -q --no-deps --force-reinstall "$REPO"

if ! command -v npm >/dev/null 2>&1; then
    echo "install_hub: installing Debian's nodejs and npm"
    apt_install nodejs npm
fi
CHP=$PREFIX/proxy/node_modules/.bin/configurable-http-proxy
if [ ! -x "$CHP" ]; then
    echo "install_hub: installing configurable-http-proxy@$CHP_VERSION"
    mkdir -p "$PREFIX/proxy"
    npm install -s --prefix "$PREFIX/proxy" --no-audit --no-fund "configurable-http-proxy@$CHP_VERSION"
fi
chmod -R a+rX "$PREFIX"
echo "install_hub: jupyterhub $("$PREFIX/venv/bin/jupyterhub" --version)," \
     "configurable-http-proxy $("$CHP" --version), torch" \
     "$("$PREFIX/venv/bin/python" -c 'import torch; print(torch.__version__)') in $PREFIX"
