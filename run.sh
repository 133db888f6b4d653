#!/usr/bin/env bash
# One entry point for the two quickstart commands:
#   ./run.sh lab    set up .venv (first time) and open the course in JupyterLab
#   ./run.sh test   set up .venv (first time) and run the whole test suite
#   ./run.sh setup  only set up .venv
#   ./run.sh site      build the course website from the stored notebooks -> build/site/html
#   ./run.sh explorer  serve the timeline explorer as an app (Voila, no code) on port 8866
#   ./run.sh slides    build offline reveal.js slides of the notebooks into build/slides/ (needs npm)
# Extra arguments go to jupyter lab / pytest / voila / the slides builder.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=.venv

setup() {
    if [ ! -x "$VENV/bin/python" ]; then
        "$PY" -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
        # torch 2.13.0: a CPU wheel this machine already has (pip's find-links), else the
        # CUDA build only where a GPU is present, else PyTorch's CPU index -- never the
        # multi-GB CUDA wheel on a machine without a GPU.
        wheels=$(mktemp -d)
        if "$VENV/bin/pip" download -q --no-index --no-deps "torch==2.13.0" -d "$wheels" 2>/dev/null; then
            "$VENV/bin/pip" install "$wheels"/torch-*.whl
        elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            "$VENV/bin/pip" install "torch==2.13.0"
        else
            "$VENV/bin/pip" install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
                --extra-index-url https://pypi.org/simple
        fi
        rm -rf "$wheels"
    fi
    "$VENV/bin/pip" install -q -e ".[course,dev]"
}

case "${1:-}" in
    setup)
        setup
        ;;
    lab)
        setup
        extra=()
        if [ "$(id -u)" = 0 ]; then extra+=(--allow-root); fi  # e.g. inside a container
        exec "$VENV/bin/jupyter" lab --ServerApp.root_dir="$PWD" \
            --LabApp.default_url=/lab/tree/notebooks/00_start_here.ipynb "${extra[@]}" "${@:2}"
        ;;
    test)
        setup
        exec "$VENV/bin/python" -m pytest "${@:2}"
        ;;
    # -- the course outside a kernel: website, explorer app, slides --
    site)
        setup
        exec "$VENV/bin/python" site/build.py "${@:2}"
        ;;
    explorer)
        setup
        # The `course` template (apps/voila/templates) is Voila's lab template without CDN links.
        JUPYTER_PATH="$PWD/apps${JUPYTER_PATH:+:$JUPYTER_PATH}" exec "$VENV/bin/voila" apps/explorer.ipynb \
            --template=course --no-browser "${@:2}"
        ;;
    slides)
        setup
        exec "$VENV/bin/python" -m toy_engine.slides "${@:2}"
        ;;
    *)
        echo "usage: ./run.sh lab | ./run.sh test | ./run.sh setup | ./run.sh site | ./run.sh explorer | ./run.sh slides" >&2
        exit 2
        ;;
esac
